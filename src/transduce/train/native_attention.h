// Scaled dot-product attention (§3.2.1, Eq. 1) over all heads (§3.2.2) for training on CPU, forward and backward,
// reading the heads straight from the projections' packed output and writing the merged heads:
//   O_i = Σ_j P_ij V_j,   P_i = softmax_j(scale · Q_i · K_j  where key j may be attended, else −∞).
//
// As tensor ops (model/attention.py's attention_written_out) one (B·h, T, T) problem of Multi30k's ~20 tokens is a
// head-split copy of Q, K and V, fp32 casts, a batched product that runs at a few percent of the GEMM peak at these
// sizes, the softmax, a second product and the heads' merge, each a pass over memory; the backward as many again,
// and the split's gradient concatenated. Here one task per (batch, head) loads its Q, K, V rows into fp32 scratch,
// does the products, the mask and the softmax there, and stores its d_v columns of the merged output; the weights P
// (B, h, T_q, T_k) fp32 are kept for the backward, which writes ∂Q, ∂K, ∂V into the columns they came from:
//   ∂V_j = Σ_i P_ij ∂O_i,  ∂P_ij = ∂O_i · V_j,  ∂S_ij = P_ij (∂P_ij − Σ_j' P_ij' ∂P_ij') · scale,
//   ∂Q_i = Σ_j ∂S_ij K_j,  ∂K_j = Σ_i ∂S_ij Q_i.
// A row with no key to attend to gives zeros (its P row is 0), as the reference's guard does. Each task writes its
// own columns, so the result does not depend on the thread count.
// Compiled into native_train.cpp's extension on first use (transduce/train/native.py).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "bf16.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using at::Tensor;

// Where one operand's rows are: token t of batch b, head h starts at base + (b·T + t)·width + offset + h·d.
struct Rows {
  int64_t T, width, offset, d;
  int64_t at(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * width + offset + h * d; }
};

// The mask as "may attend" bytes broadcast to (B, h, T_q, T_k) by its strides (0 where it broadcasts), or none;
// causal: key j ≤ i + T_k − T_q.
struct Mask {
  const bool* data;
  int64_t sb, sh, sq, sk;
  bool causal;
  int64_t offset;
  bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (causal && j > i + offset) return false;
    return data == nullptr || data[b * sb + h * sh + i * sq + j * sk];
  }
};

template <typename T>
void load_rows(const T* src, const Rows& r, int64_t b, int64_t h, int64_t n, float* dst) {
  for (int64_t t = 0; t < n; ++t) {
    const T* row = src + r.at(b, t, h);
    for (int64_t c = 0; c < r.d; ++c) dst[t * r.d + c] = transduce::load(row, c);
  }
}

template <typename T>
void store_rows(const float* src, const Rows& r, int64_t b, int64_t h, int64_t n, T* dst) {
  for (int64_t t = 0; t < n; ++t) {
    T* row = dst + r.at(b, t, h);
    for (int64_t c = 0; c < r.d; ++c) transduce::store(row, c, src[t * r.d + c]);
  }
}

// D: the head width d_k = d_v when it is one of kWidths, known at compile time so that the loops over a row unroll
// into whole vectors; 0: any widths, read from the Rows.
template <typename T, int D>
void attention_heads(const T* qs, const T* ks, const T* vs, Rows qr, Rows kr, Rows vr, Mask mask, int64_t B,
                     int64_t H, float scale, T* out, Rows outr, float* P) {
  const int64_t Tq = qr.T, Tk = kr.T, dk = D ? D : qr.d, dv = D ? D : vr.d;
  at::parallel_for(0, B * H, 1, [&](int64_t first, int64_t last) {
    std::vector<float> q(Tq * dk), k(Tk * dk), v(Tk * dv), o(Tq * dv);
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_rows(qs, qr, b, h, Tq, q.data());
      load_rows(ks, kr, b, h, Tk, k.data());
      load_rows(vs, vr, b, h, Tk, v.data());
      for (int64_t i = 0; i < Tq; ++i) {
        float* p = P + (bh * Tq + i) * Tk;  // row i of this head's weights
        const float* qi = q.data() + i * dk;
        for (int64_t j = 0; j < Tk; ++j) {
          const float* kj = k.data() + j * dk;
          float s = 0;
          for (int64_t c = 0; c < dk; ++c) s += qi[c] * kj[c];
          p[j] = s * scale;
        }
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < Tk; ++j) {
          if (!mask.keep(b, h, i, j)) p[j] = -std::numeric_limits<float>::infinity();
          top = std::max(top, p[j]);
        }
        float* __restrict__ oi = o.data() + i * dv;
        for (int64_t c = 0; c < dv; ++c) oi[c] = 0;
        if (top == -std::numeric_limits<float>::infinity()) {  // no key to attend to: zeros
          for (int64_t j = 0; j < Tk; ++j) p[j] = 0;
          continue;
        }
        float sum = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          p[j] = std::exp(p[j] - top);  // exp(−∞) = 0 for a masked key
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < Tk; ++j) {
          p[j] *= inv;
          if (p[j] == 0) continue;
          const float* __restrict__ vj = v.data() + j * dv;
          const float pj = p[j];
          for (int64_t c = 0; c < dv; ++c) oi[c] += pj * vj[c];
        }
      }
      store_rows(o.data(), outr, b, h, Tq, out);
    }
  });
}

template <typename T, int D>
void attention_heads_backward(const T* g, Rows gr, const float* P, const T* qs, const T* ks, const T* vs, Rows qr,
                              Rows kr, Rows vr, int64_t B, int64_t H, float scale, T* dqs, T* dks, T* dvs) {
  const int64_t Tq = qr.T, Tk = kr.T, dk = D ? D : qr.d, dv = D ? D : vr.d;
  at::parallel_for(0, B * H, 1, [&](int64_t first, int64_t last) {
    std::vector<float> q(Tq * dk), k(Tk * dk), v(Tk * dv), go(Tq * dv), dq(Tq * dk), dkk(Tk * dk), dvv(Tk * dv),
        dp(Tk);
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_rows(qs, qr, b, h, Tq, q.data());
      load_rows(ks, kr, b, h, Tk, k.data());
      load_rows(vs, vr, b, h, Tk, v.data());
      load_rows(g, gr, b, h, Tq, go.data());
      for (auto& x : dkk) x = 0;
      for (auto& x : dvv) x = 0;
      for (int64_t i = 0; i < Tq; ++i) {
        const float* p = P + (bh * Tq + i) * Tk;
        const float* __restrict__ gi = go.data() + i * dv;
        float r = 0;  // Σ_j P_ij ∂P_ij
        for (int64_t j = 0; j < Tk; ++j) {
          if (p[j] == 0) {
            dp[j] = 0;
            continue;
          }
          const float* __restrict__ vj = v.data() + j * dv;
          float* __restrict__ dvj = dvv.data() + j * dv;
          const float pj = p[j];
          float s = 0;
          for (int64_t c = 0; c < dv; ++c) {
            s += gi[c] * vj[c];
            dvj[c] += pj * gi[c];
          }
          dp[j] = s;
          r += p[j] * s;
        }
        float* __restrict__ dqi = dq.data() + i * dk;
        const float* __restrict__ qi = q.data() + i * dk;
        for (int64_t c = 0; c < dk; ++c) dqi[c] = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          if (p[j] == 0) continue;
          const float ds = p[j] * (dp[j] - r) * scale;
          const float* __restrict__ kj = k.data() + j * dk;
          float* __restrict__ dkj = dkk.data() + j * dk;
          for (int64_t c = 0; c < dk; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
      }
      store_rows(dq.data(), qr, b, h, Tq, dqs);
      store_rows(dkk.data(), kr, b, h, Tk, dks);
      store_rows(dvv.data(), vr, b, h, Tk, dvs);
    }
  });
}

// Calls f with D (the template argument above) for these head widths.
template <typename F>
void with_width(int64_t d_k, int64_t d_v, F&& f) {
  if (d_k == d_v && d_k == 32) return f(std::integral_constant<int, 32>{});
  if (d_k == d_v && d_k == 64) return f(std::integral_constant<int, 64>{});
  if (d_k == d_v && d_k == 128) return f(std::integral_constant<int, 128>{});
  f(std::integral_constant<int, 0>{});
}

void check_source(const Tensor& t, const char* name, int64_t B, int64_t need) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dim() == 3 && t.size(0) == B && t.size(2) >= need,
              "native attention: ", name, " must be a contiguous CPU (", B, ", T, ≥ ", need, ") tensor");
}

template <typename T>
T* ptr(const Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// q_src (B, T_q, ·) holds Q at columns [q_off, q_off + h·d_k); kv_src (B, T_k, ·) holds K at k_off and V at v_off
// (h·d_v columns); fp32 or bf16, the same dtype. mask: bool (B, h, T_q, T_k), strided (expanded), or undefined.
// -> the merged heads (B, T_q, h·d_v) in the sources' dtype, and P (B, h, T_q, T_k) fp32.
std::tuple<Tensor, Tensor> attention(const Tensor& q_src, const Tensor& kv_src, int64_t q_off, int64_t k_off,
                                     int64_t v_off, int64_t heads, int64_t d_k, int64_t d_v,
                                     const c10::optional<Tensor>& mask, bool causal, double scale) {
  const int64_t B = q_src.size(0), Tq = q_src.size(1), Tk = kv_src.size(1);
  check_source(q_src, "q_src", B, q_off + heads * d_k);
  check_source(kv_src, "kv_src", B, std::max(k_off + heads * d_k, v_off + heads * d_v));
  TORCH_CHECK(q_src.scalar_type() == kv_src.scalar_type(), "native attention: q_src and kv_src differ in dtype");
  Mask m{nullptr, 0, 0, 0, 0, causal, Tk - Tq};
  if (mask.has_value() && mask->defined()) {
    const Tensor& t = *mask;
    TORCH_CHECK(t.scalar_type() == at::kBool && t.dim() == 4 && t.size(0) == B && t.size(1) == heads &&
                    t.size(2) == Tq && t.size(3) == Tk,
                "native attention: the mask must be bool (B, h, T_q, T_k), expanded");
    m = Mask{t.data_ptr<bool>(), t.stride(0), t.stride(1), t.stride(2), t.stride(3), causal, Tk - Tq};
  }
  const Rows qr{Tq, q_src.size(2), q_off, d_k}, kr{Tk, kv_src.size(2), k_off, d_k}, vr{Tk, kv_src.size(2), v_off, d_v};
  const Rows outr{Tq, heads * d_v, 0, d_v};
  Tensor out = at::empty({B, Tq, heads * d_v}, q_src.options());
  Tensor P = at::empty({B, heads, Tq, Tk}, q_src.options().dtype(at::kFloat));
  const auto s = static_cast<float>(scale);
  TORCH_CHECK(q_src.scalar_type() == at::kFloat || q_src.scalar_type() == at::kBFloat16,
              "native attention: fp32 or bf16, got ", q_src.scalar_type());
  with_width(d_k, d_v, [&](auto width) {
    constexpr int D = decltype(width)::value;
    if (q_src.scalar_type() == at::kFloat) {
      attention_heads<float, D>(ptr<const float>(q_src), ptr<const float>(kv_src), ptr<const float>(kv_src), qr, kr,
                                vr, m, B, heads, s, ptr<float>(out), outr, P.data_ptr<float>());
    } else {
      attention_heads<uint16_t, D>(ptr<const uint16_t>(q_src), ptr<const uint16_t>(kv_src),
                                   ptr<const uint16_t>(kv_src), qr, kr, vr, m, B, heads, s, ptr<uint16_t>(out), outr,
                                   P.data_ptr<float>());
    }
  });
  return {out, P};
}

// ∂ of the merged heads (B, T_q, h·d_v) and the forward's P -> ∂q_src and ∂kv_src, written at the columns the
// forward read (the rest of those tensors is left as given: callers pass zeros where a column is not Q, K or V).
void attention_backward(const Tensor& grad, const Tensor& P, const Tensor& q_src, const Tensor& kv_src, int64_t q_off,
                        int64_t k_off, int64_t v_off, int64_t heads, int64_t d_k, int64_t d_v, double scale,
                        Tensor& dq_src, Tensor& dkv_src) {
  const int64_t B = q_src.size(0), Tq = q_src.size(1), Tk = kv_src.size(1);
  check_source(grad, "the gradient", B, heads * d_v);
  TORCH_CHECK(grad.size(1) == Tq && grad.scalar_type() == q_src.scalar_type(), "native attention: gradient shape");
  TORCH_CHECK(P.is_contiguous() && P.scalar_type() == at::kFloat && P.numel() == B * heads * Tq * Tk,
              "native attention: P must be the forward's (B, h, T_q, T_k) fp32");
  TORCH_CHECK(dq_src.sizes() == q_src.sizes() && dkv_src.sizes() == kv_src.sizes() && dq_src.is_contiguous() &&
                  dkv_src.is_contiguous() && dq_src.scalar_type() == q_src.scalar_type() &&
                  dkv_src.scalar_type() == q_src.scalar_type(),
              "native attention: the gradients must be contiguous tensors shaped as the sources");
  const Rows qr{Tq, q_src.size(2), q_off, d_k}, kr{Tk, kv_src.size(2), k_off, d_k}, vr{Tk, kv_src.size(2), v_off, d_v};
  const Rows gr{Tq, heads * d_v, 0, d_v};
  const auto s = static_cast<float>(scale);
  with_width(d_k, d_v, [&](auto width) {
    constexpr int D = decltype(width)::value;
    if (q_src.scalar_type() == at::kFloat) {
      attention_heads_backward<float, D>(ptr<const float>(grad), gr, P.data_ptr<float>(), ptr<const float>(q_src),
                                         ptr<const float>(kv_src), ptr<const float>(kv_src), qr, kr, vr, B, heads, s,
                                         ptr<float>(dq_src), ptr<float>(dkv_src), ptr<float>(dkv_src));
    } else {
      attention_heads_backward<uint16_t, D>(ptr<const uint16_t>(grad), gr, P.data_ptr<float>(),
                                            ptr<const uint16_t>(q_src), ptr<const uint16_t>(kv_src),
                                            ptr<const uint16_t>(kv_src), qr, kr, vr, B, heads, s,
                                            ptr<uint16_t>(dq_src), ptr<uint16_t>(dkv_src), ptr<uint16_t>(dkv_src));
    }
  });
}

}  // namespace
