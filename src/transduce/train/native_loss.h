// The label-smoothed loss (§5.4) and R-Drop's loss of one block of logit rows, in three passes per row.
//
// loss.py's _block and _rdrop_block compute the same thing with ~20 whole-block tensor ops each (shift,
// exp, sums, divisions, scatters); on a 1-thread CPU step of the `small` preset those ops cost four times
// the projection matmuls around them. Here each row is read three times and its gradient written once:
//   pass 1: the row's max;  pass 2: e = exp(z − max) kept in scratch, and the sums;
//   pass 3: ∂loss/∂z written over the logits, in their dtype (bf16 or fp32).
// Maths (u = ε/(V−1), q = (1−ε)·onehot(y) + u on every non-pad token, lse = log Σ exp z):
//   smoothed loss = −Σ_v q_v (z_v − lse);          ∂/∂z = softmax(z) − q
//   R-Drop, d = log p₁ − log p₂ = z₁ − z₂ − (lse₁ − lse₂), A_k = ⟨p_k, d⟩:
//   symmetric KL = A₁ − A₂;  ∂KL/∂z₁ = p₁(d − A₁) + (p₁ − p₂),  ∂KL/∂z₂ = p₂(A₂ − d) − (p₁ − p₂)
//   and A_k = (Σ_v e_k,v (z₁ − z₂)_v) / Σ_v e_k,v − (lse₁ − lse₂), so pass 2 accumulates it from e.
// Compiled into native_train.cpp's extension on first use (transduce/train/native.py); without a compiler
// the tensor-op version in loss.py runs. Compiled with -ffast-math so that the exp loops vectorise.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "bf16.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using at::Tensor;

namespace {

using transduce::load;
using transduce::store;

template <typename T>
float row_max(const T* z, int64_t V) {
  float m = load(z, 0);
  for (int64_t v = 1; v < V; ++v) m = std::max(m, load(z, v));
  return m;
}

// Smoothed cross-entropy of rows z (r, V), labels y (r,): z is overwritten by ∂loss/∂z when `grad`.
// out (r, 2): loss and NLL of each row.
template <typename T>
void smoothed_rows(T* z, const int64_t* y, float* out, int64_t r, int64_t V, float eps, int64_t pad,
                   bool grad) {
  const float u = eps / static_cast<float>(V - 1);
  at::parallel_for(0, r, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(V);
    for (int64_t i = begin; i < end; ++i) {
      T* zi = z + i * V;
      const float m = row_max(zi, V);
      float s = 0, sz = 0;
      for (int64_t v = 0; v < V; ++v) {
        const float x = load(zi, v);
        e[v] = std::exp(x - m);
        s += e[v];
        sz += x;
      }
      const float lse = m + std::log(s), zy = load(zi, y[i]), zpad = load(zi, pad);
      const double spread = (static_cast<double>(sz) - zpad) - static_cast<double>(V - 1) * lse;  // Σ_{v≠pad} log p_v
      out[2 * i] = static_cast<float>(-(1 - eps) * (zy - lse) - u * spread);
      out[2 * i + 1] = lse - zy;
      if (!grad) continue;
      const float inv = 1.0f / s;
      for (int64_t v = 0; v < V; ++v) store(zi, v, e[v] * inv - u);
      store(zi, pad, e[pad] * inv);
      store(zi, y[i], e[y[i]] * inv - u - (1 - eps));
    }
  });
}

// R-Drop's loss of two copies z1, z2 (r, V) of the same rows: both smoothed losses + α/2 · Σ_v Δ_v d_v
// (= α × the mean of the two KLs, as loss.rdrop_loss). z1, z2 are overwritten by their gradients.
// out (r, 2): loss and the summed NLL of both copies.
template <typename T>
void rdrop_rows(T* z1, T* z2, const int64_t* y, float* out, int64_t r, int64_t V, float eps, int64_t pad,
                float alpha, bool grad) {
  const float u = eps / static_cast<float>(V - 1), h = 0.5f * alpha;
  at::parallel_for(0, r, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e1(V), e2(V);
    for (int64_t i = begin; i < end; ++i) {
      T* a = z1 + i * V;
      T* b = z2 + i * V;
      const float m1 = row_max(a, V), m2 = row_max(b, V);
      float s1 = 0, s2 = 0, sz1 = 0, sz2 = 0, w1 = 0, w2 = 0;  // w_k = Σ e_k (z1 − z2)
      for (int64_t v = 0; v < V; ++v) {
        const float x1 = load(a, v), x2 = load(b, v), diff = x1 - x2;
        e1[v] = std::exp(x1 - m1);
        e2[v] = std::exp(x2 - m2);
        s1 += e1[v];
        s2 += e2[v];
        sz1 += x1;
        sz2 += x2;
        w1 += e1[v] * diff;
        w2 += e2[v] * diff;
      }
      const float lse1 = m1 + std::log(s1), lse2 = m2 + std::log(s2), c = lse1 - lse2;
      const float A1 = w1 / s1 - c, A2 = w2 / s2 - c;
      const int64_t gold = y[i];
      const float y1 = load(a, gold) - lse1, y2 = load(b, gold) - lse2;  // log p_k(y)
      const double spread1 = (static_cast<double>(sz1) - load(a, pad)) - static_cast<double>(V - 1) * lse1;
      const double spread2 = (static_cast<double>(sz2) - load(b, pad)) - static_cast<double>(V - 1) * lse2;
      out[2 * i] = static_cast<float>(-(1 - eps) * (y1 + y2) - u * (spread1 + spread2) + h * (A1 - A2));
      out[2 * i + 1] = -(y1 + y2);
      if (!grad) continue;
      const float inv1 = 1.0f / s1, inv2 = 1.0f / s2;
      // gradient of column v, before the pad and gold corrections
      auto g = [&](int64_t v, float& g1, float& g2) {
        const float p1 = e1[v] * inv1, p2 = e2[v] * inv2, d = load(a, v) - load(b, v) - c, delta = p1 - p2;
        g1 = h * (p1 * (d - A1) + delta) + p1 - u;
        g2 = h * (p2 * (A2 - d) - delta) + p2 - u;
      };
      float gp1, gp2, gy1, gy2;  // the two corrected columns, from the logits before they are overwritten
      g(pad, gp1, gp2);
      g(gold, gy1, gy2);
      for (int64_t v = 0; v < V; ++v) {
        float g1, g2;
        g(v, g1, g2);
        store(a, v, g1);
        store(b, v, g2);
      }
      store(a, pad, gp1 + u);
      store(b, pad, gp2 + u);
      store(a, gold, gy1 - (1 - eps));
      store(b, gold, gy2 - (1 - eps));
    }
  });
}

void check(const Tensor& z, const Tensor& y, const char* name) {
  TORCH_CHECK(z.device().is_cpu() && z.dim() == 2 && z.is_contiguous(), name, ": a contiguous (r, V) CPU tensor");
  TORCH_CHECK(z.scalar_type() == at::kFloat || z.scalar_type() == at::kBFloat16, name, ": fp32 or bf16");
  TORCH_CHECK(y.scalar_type() == at::kLong && y.dim() == 1 && y.size(0) == z.size(0) && y.is_contiguous(),
              "labels: a contiguous int64 (r,) tensor");
}

// Loss and NLL (r, 2) of the rows of z (r, V), labels y (r,); z becomes ∂loss/∂z when `grad`.
Tensor smoothed_block_(Tensor z, const Tensor& y, double eps, int64_t pad, bool grad) {
  check(z, y, "logits");
  const int64_t r = z.size(0), V = z.size(1);
  Tensor out = at::empty({r, 2}, z.options().dtype(at::kFloat));
  if (z.scalar_type() == at::kFloat)
    smoothed_rows(z.data_ptr<float>(), y.data_ptr<int64_t>(), out.data_ptr<float>(), r, V, eps, pad, grad);
  else
    smoothed_rows(reinterpret_cast<uint16_t*>(z.data_ptr<at::BFloat16>()), y.data_ptr<int64_t>(),
                  out.data_ptr<float>(), r, V, eps, pad, grad);
  return out;
}

// R-Drop loss and summed NLL (r, 2) of the paired rows of z1, z2 (r, V); both become their gradients.
Tensor rdrop_block_(Tensor z1, Tensor z2, const Tensor& y, double eps, int64_t pad, double alpha, bool grad) {
  check(z1, y, "logits of copy 1");
  check(z2, y, "logits of copy 2");
  TORCH_CHECK(z1.sizes() == z2.sizes() && z1.scalar_type() == z2.scalar_type(), "the two copies differ in shape or dtype");
  const int64_t r = z1.size(0), V = z1.size(1);
  Tensor out = at::empty({r, 2}, z1.options().dtype(at::kFloat));
  if (z1.scalar_type() == at::kFloat)
    rdrop_rows(z1.data_ptr<float>(), z2.data_ptr<float>(), y.data_ptr<int64_t>(), out.data_ptr<float>(), r, V,
               eps, pad, alpha, grad);
  else
    rdrop_rows(reinterpret_cast<uint16_t*>(z1.data_ptr<at::BFloat16>()),
               reinterpret_cast<uint16_t*>(z2.data_ptr<at::BFloat16>()), y.data_ptr<int64_t>(),
               out.data_ptr<float>(), r, V, eps, pad, alpha, grad);
  return out;
}

}  // namespace
