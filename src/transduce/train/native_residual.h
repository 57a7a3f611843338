// The paper's sub-layer connection (§3.1, with §5.4's residual dropout) in one pass per row, forward and backward:
//   z = LayerNorm(x + Dropout(y)),   x: the fp32 residual stream, y: the sub-layer's output (fp32 or bf16).
//
// As tensor ops (model/layers.py's Residual) that is dropout, a dtype promotion of y (bf16 under autocast),
// the add and the norm forward, each a pass over the (tokens, d_model) activation, and in the backward the
// norm's gradient, its cast back to y's dtype and the dropout's: six passes where this kernel makes two.
// Each row is read once into scratch; the norm's statistics are taken there in fp32.
//
// Dropout is native_dropout.h's: element e is kept when the low 15 bits of 16-bit lane e of the words
// splitmix64(seed + w·φ) are ≥ threshold, so a run's masks have FastDropout's distribution and nothing is
// stored (the backward pass recomputes the mask from the seed).
//
// Backward, with x̂ = (s − μ)·rstd and g = ∂L/∂z:   ∂L/∂γ = Σ_rows g ⊙ x̂,  ∂L/∂β = Σ_rows g,
//   ∂L/∂s = rstd · (gγ − mean(gγ) − x̂ · mean(gγ ⊙ x̂)),   ∂L/∂x = ∂L/∂s,   ∂L/∂y = ∂L/∂s ⊙ keep · scale.
// The column sums run over fixed blocks of rows, added in block order: the result does not depend on the
// thread count.
// Compiled into native_train.cpp's extension on first use (transduce/train/native.py); without a compiler
// the tensor ops run.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "bf16.h"
#include "native_dropout.h"

#include <cmath>
#include <cstring>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

// keep · scale for elements [start, start + n) of a tensor under (seed, threshold): native_dropout.h's mask. As
// there, the words are made first in a loop the compiler vectorises, then read as 16-bit lanes.
struct KeepFactors {
  std::vector<uint64_t> words;
  std::vector<uint16_t> lanes;

  void operator()(uint64_t seed, int64_t start, int64_t n, uint32_t threshold, float scale, float* f) {
    if (threshold == 0) {
      for (int64_t i = 0; i < n; ++i) f[i] = scale;
      return;
    }
    const int64_t first = start / 4, count = (start + n + 3) / 4 - first;
    words.resize(count);
    lanes.resize(4 * count);
    for (int64_t w = 0; w < count; ++w)
      words[w] = splitmix64(seed + static_cast<uint64_t>(first + w) * 0x9E3779B97F4A7C15ull);
    std::memcpy(lanes.data(), words.data(), 8 * count);
    const uint16_t* lane = lanes.data() + (start - 4 * first);
    for (int64_t i = 0; i < n; ++i) f[i] = (lane[i] & 0x7FFFu) >= threshold ? scale : 0.0f;
  }
};

template <typename T>
void residual_rows(const float* x, const T* y, const float* gamma, const float* beta, float* z, float* xhat,
                   float* rstd, int64_t rows, int64_t d, float eps, uint64_t seed, uint32_t threshold, float scale) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> s(d), f(d);
    KeepFactors keep;
    for (int64_t r = begin; r < end; ++r) {
      keep(seed, r * d, d, threshold, scale, f.data());
      const float* xr = x + r * d;
      const T* yr = y + r * d;
      float sum = 0;
      for (int64_t j = 0; j < d; ++j) {
        s[j] = xr[j] + transduce::load(yr, j) * f[j];
        sum += s[j];
      }
      const float mean = sum / static_cast<float>(d);
      float var = 0;
      for (int64_t j = 0; j < d; ++j) var += (s[j] - mean) * (s[j] - mean);
      const float rs = 1.0f / std::sqrt(var / static_cast<float>(d) + eps);
      rstd[r] = rs;
      float* __restrict__ hr = xhat + r * d;
      float* __restrict__ zr = z + r * d;
      for (int64_t j = 0; j < d; ++j) {
        hr[j] = (s[j] - mean) * rs;
        zr[j] = hr[j] * gamma[j] + beta[j];
      }
    }
  });
}

constexpr int64_t kBlock = 64;  // rows per block of the column sums

template <typename T>
void residual_rows_backward(const float* g, const float* xhat, const float* rstd, const float* gamma, float* dx,
                            T* dy, float* partial, int64_t rows, int64_t d, uint64_t seed, uint32_t threshold,
                            float scale) {
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> f(d);
    KeepFactors keep;
    for (int64_t b = first; b < last; ++b) {
      float* __restrict__ dgamma = partial + b * 2 * d;  // this block's Σ g ⊙ x̂, then Σ g
      float* __restrict__ dbeta = dgamma + d;
      for (int64_t j = 0; j < 2 * d; ++j) dgamma[j] = 0;
      for (int64_t r = b * kBlock; r < std::min(rows, (b + 1) * kBlock); ++r) {
        const float* gr = g + r * d;
        const float* hr = xhat + r * d;
        float a = 0, c = 0;  // Σ gγ and Σ gγ ⊙ x̂
        for (int64_t j = 0; j < d; ++j) {
          const float gg = gr[j] * gamma[j];
          a += gg;
          c += gg * hr[j];
          dgamma[j] += gr[j] * hr[j];
          dbeta[j] += gr[j];
        }
        a /= static_cast<float>(d);
        c /= static_cast<float>(d);
        keep(seed, r * d, d, threshold, scale, f.data());
        float* __restrict__ dxr = dx + r * d;
        T* __restrict__ dyr = dy + r * d;
        const float rs = rstd[r];
        for (int64_t j = 0; j < d; ++j) {
          const float ds = rs * (gr[j] * gamma[j] - a - hr[j] * c);
          dxr[j] = ds;
          transduce::store(dyr, j, ds * f[j]);
        }
      }
    }
  });
}

void check_rows(const Tensor& t, const char* name, int64_t rows, int64_t d) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dim() == 2 && t.size(0) == rows && t.size(1) == d,
              "native residual: ", name, " must be a contiguous CPU (", rows, ", ", d, ") tensor");
}

// x (rows, d) fp32, y (rows, d) fp32 or bf16, gamma and beta (d,) fp32 -> z (rows, d), x̂ (rows, d), rstd (rows,).
std::tuple<Tensor, Tensor, Tensor> residual_norm(const Tensor& x, const Tensor& y, const Tensor& gamma,
                                                 const Tensor& beta, double eps, int64_t seed, int64_t threshold,
                                                 double scale) {
  const int64_t rows = x.size(0), d = x.size(1);
  TORCH_CHECK(x.scalar_type() == at::kFloat && gamma.scalar_type() == at::kFloat && beta.scalar_type() == at::kFloat,
              "native residual: x, gamma and beta must be fp32");
  TORCH_CHECK(threshold >= 0 && threshold <= 32768, "native residual: threshold ", threshold, " outside [0, 32768]");
  check_rows(x, "x", rows, d);
  check_rows(y, "y", rows, d);
  check_rows(gamma.view({1, -1}), "gamma", 1, d);
  check_rows(beta.view({1, -1}), "beta", 1, d);
  Tensor z = at::empty_like(x), xhat = at::empty_like(x), rstd = at::empty({rows}, x.options());
  const auto e = static_cast<float>(eps);
  const auto s = static_cast<uint64_t>(seed);
  const auto t = static_cast<uint32_t>(threshold);
  const auto sc = static_cast<float>(scale);
  const float *xp = x.data_ptr<float>(), *gp = gamma.data_ptr<float>(), *bp = beta.data_ptr<float>();
  float *zp = z.data_ptr<float>(), *hp = xhat.data_ptr<float>(), *rp = rstd.data_ptr<float>();
  if (y.scalar_type() == at::kFloat) {
    residual_rows(xp, y.data_ptr<float>(), gp, bp, zp, hp, rp, rows, d, e, s, t, sc);
  } else {
    TORCH_CHECK(y.scalar_type() == at::kBFloat16, "native residual: y must be fp32 or bf16, got ", y.scalar_type());
    residual_rows(xp, reinterpret_cast<const uint16_t*>(y.data_ptr<at::BFloat16>()), gp, bp, zp, hp, rp, rows, d, e,
                  s, t, sc);
  }
  return {z, xhat, rstd};
}

// g (rows, d) fp32, x̂ and rstd from the forward -> ∂x (fp32), ∂y (y_dtype), ∂γ, ∂β.
std::tuple<Tensor, Tensor, Tensor, Tensor> residual_norm_backward(const Tensor& g, const Tensor& xhat,
                                                                  const Tensor& rstd, const Tensor& gamma,
                                                                  int64_t seed, int64_t threshold, double scale,
                                                                  bool y_bf16) {
  const int64_t rows = g.size(0), d = g.size(1);
  TORCH_CHECK(g.scalar_type() == at::kFloat, "native residual: the gradient must be fp32");
  check_rows(g, "the gradient", rows, d);
  check_rows(xhat, "x̂", rows, d);
  check_rows(rstd.view({-1, 1}), "rstd", rows, 1);
  Tensor dx = at::empty_like(g);
  Tensor dy = at::empty_like(g, y_bf16 ? g.options().dtype(at::kBFloat16) : g.options());
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  Tensor partial = at::empty({blocks, 2, d}, g.options());
  const auto s = static_cast<uint64_t>(seed);
  const auto t = static_cast<uint32_t>(threshold);
  const auto sc = static_cast<float>(scale);
  if (y_bf16) {
    residual_rows_backward(g.data_ptr<float>(), xhat.data_ptr<float>(), rstd.data_ptr<float>(),
                           gamma.data_ptr<float>(), dx.data_ptr<float>(),
                           reinterpret_cast<uint16_t*>(dy.data_ptr<at::BFloat16>()), partial.data_ptr<float>(), rows,
                           d, s, t, sc);
  } else {
    residual_rows_backward(g.data_ptr<float>(), xhat.data_ptr<float>(), rstd.data_ptr<float>(),
                           gamma.data_ptr<float>(), dx.data_ptr<float>(), dy.data_ptr<float>(),
                           partial.data_ptr<float>(), rows, d, s, t, sc);
  }
  Tensor sums = at::empty({2, d}, g.options());  // ∂γ then ∂β: the blocks' partial sums, added in block order
  float* out = sums.data_ptr<float>();
  const float* part = partial.data_ptr<float>();
  for (int64_t j = 0; j < 2 * d; ++j) out[j] = 0;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < 2 * d; ++j) out[j] += part[b * 2 * d + j];
  return {dx, dy, sums[0], sums[1]};
}

}  // namespace
