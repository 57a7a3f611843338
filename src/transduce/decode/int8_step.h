// The int8 decoder step's non-GEMM work as plain loops over float buffers (paper §3.1, §3.2).
//
// At batch 1 (beam 4: 4 rows) each ATen op of a step costs ~1-3 µs of dispatch and allocation for well
// under a µs of arithmetic, and the step had ~40 of them per layer. The int8 step is an approximation of
// fp32 already (int8_gemm.h), so it does not need ATen's op-for-op arithmetic: these loops compute the
// same functions (attention over the key cache, residual + layer norm, embedding) in fp32 with their own
// summation order. The fp32 and bf16 C++ steps keep the ATen ops (and Python's exact outputs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>

#include "int8_gemm.h"  // TRANSDUCE_VNNI, <immintrin.h>

namespace int8 {

// f(n) for n in [0, N), split over ATen's threads when the rows carry enough work (`work` floats each).
template <typename F>
inline void rows(int64_t N, int64_t work, const F& f) {
  at::parallel_for(0, N, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, work)), [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) f(n);
  });
}

// Σ a·b over n floats (AVX-512: 16 lanes at a time, then the remainder).
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_VNNI
  if (n >= 16) {
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
  }
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Σ a over n floats; as dot.
inline float sum(const float* a, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_VNNI
  if (n >= 16) {
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(a + i));
    s = _mm512_reduce_add_ps(acc);
  }
#endif
  for (; i < n; ++i) s += a[i];
  return s;
}

// Σ (a - c)² over n floats (with c the mean: n · variance); as dot.
inline float sum_squares(const float* a, float c, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_VNNI
  if (n >= 16) {
    const __m512 vc = _mm512_set1_ps(c);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_sub_ps(_mm512_loadu_ps(a + i), vc);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    s = _mm512_reduce_add_ps(acc);
  }
#endif
  for (; i < n; ++i) s += (a[i] - c) * (a[i] - c);
  return s;
}

// x (N, d) <- layer_norm(x [+ y]) with weight w and bias b, row by row.
inline void add_layer_norm(float* x, const float* y, const float* w, const float* b, int64_t N, int64_t d,
                           float eps) {
  rows(N, d, [&](int64_t n) {
    float* row = x + n * d;
    if (y != nullptr)
      for (int64_t i = 0; i < d; ++i) row[i] += y[n * d + i];
    const float mean = sum(row, d) / static_cast<float>(d);
    const float inv = 1.0f / std::sqrt(sum_squares(row, mean, d) / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) row[i] = (row[i] - mean) * inv * w[i] + b[i];
  });
}

// x (M, d) <- x + sublayer(x) (§3.1), the layer norm (weight w, bias b) after the sum (post-norm, the
// paper) or on the sublayer's input (pre-norm). sublayer(in) reads `in` (M, d) and writes y (M, d);
// scratch (M, d) holds the pre-norm input.
template <typename F>
inline void residual(bool pre_norm, float* x, float* scratch, const float* y, const float* w, const float* b,
                     int64_t M, int64_t d, float eps, const F& sublayer) {
  if (pre_norm) {
    std::memcpy(scratch, x, M * d * sizeof(float));
    add_layer_norm(scratch, nullptr, w, b, M, d, eps);
    sublayer(scratch);
    for (int64_t i = 0; i < M * d; ++i) x[i] += y[i];
  } else {
    sublayer(x);
    add_layer_norm(x, y, w, b, M, d, eps);
  }
}

// The feed-forward's activation: ReLU (§3.3), GELU (the exact erf form, as torch's default) or Swish
// (x·σ(x), torch's SiLU); model.activation's names, parsed once by native_step.cpp.
enum class Activation { relu, gelu, swish };

// y (M, d) = W2 act(W1 x + b1) + b2 (§3.3); hidden (M, d_ff) is scratch.
inline void feed_forward(const float* x, int64_t M, const Weights& w1, const Weights& w2, float* hidden, float* y,
                         Activation act) {
  gemm(x, M, w1, hidden);
  const int64_t n = M * w1.out;
  switch (act) {
    case Activation::gelu:  // x Φ(x)
      for (int64_t i = 0; i < n; ++i) hidden[i] = 0.5f * hidden[i] * (1.0f + std::erf(hidden[i] * 0.70710678f));
      break;
    case Activation::swish:
      for (int64_t i = 0; i < n; ++i) hidden[i] = hidden[i] / (1.0f + std::exp(-hidden[i]));  // x σ(x)
      break;
    case Activation::relu:
      for (int64_t i = 0; i < n; ++i) hidden[i] = std::max(hidden[i], 0.0f);
      break;
  }
  gemm(hidden, M, w2, y);
}

// out (d_k) = softmax(scale · q Kᵀ) V over the T keys at k, v (T, d_k each, rows ks and vs floats apart);
// visible (T) or null: only those keys. No visible key: zeros (as attention_reference).
inline void attend_one(const float* q, const float* k, const float* v, int64_t T, int64_t ks, int64_t vs,
                       int64_t d_k, float scale, const bool* visible, float* scores, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < T; ++t) {
    scores[t] = visible == nullptr || visible[t] ? dot(q, k + t * ks, d_k) * scale
                                                 : -std::numeric_limits<float>::infinity();
    top = std::max(top, scores[t]);
  }
  std::fill(out, out + d_k, 0.0f);
  if (top == -std::numeric_limits<float>::infinity()) return;
  float total = 0.0f;
  for (int64_t t = 0; t < T; ++t) total += scores[t] = std::exp(scores[t] - top);
  const float inv = 1.0f / total;
  for (int64_t t = 0; t < T; ++t) {
    const float p = scores[t] * inv;
    const float* vt = v + t * vs;
    for (int64_t i = 0; i < d_k; ++i) out[i] += p * vt[i];
  }
}

// Masked self-attention of one new position per row (§3.2.3) with the key/value cache.
// qkv (N, 3, h, d_k): this step's projections; old_k/old_v (N', h, t, d_k) or null (first step);
// kept (N) or null: which old row each row continues (a pending beam reorder); new_k/new_v (N, h, t+1, d_k)
// receive the kept cache and this position; out (N, h·d_k).
inline void self_attention(const float* qkv, const float* old_k, const float* old_v, const int64_t* kept,
                           int64_t N, int64_t h, int64_t t, int64_t d_k, float scale, float* new_k,
                           float* new_v, float* out) {
  const int64_t d = h * d_k, T = t + 1;
  rows(N, h * T * d_k, [&](int64_t n) {
    thread_local std::vector<float> scores;
    scores.resize(T);
    const int64_t src = kept != nullptr ? kept[n] : n;
    for (int64_t j = 0; j < h; ++j) {
      float* kc = new_k + (n * h + j) * T * d_k;  // (T, d_k)
      float* vc = new_v + (n * h + j) * T * d_k;
      if (t > 0) {
        std::memcpy(kc, old_k + (src * h + j) * t * d_k, t * d_k * sizeof(float));
        std::memcpy(vc, old_v + (src * h + j) * t * d_k, t * d_k * sizeof(float));
      }
      const float* q = qkv + n * 3 * d + j * d_k;
      std::memcpy(kc + t * d_k, q + d, d_k * sizeof(float));
      std::memcpy(vc + t * d_k, q + 2 * d, d_k * sizeof(float));
      attend_one(q, kc, vc, T, d_k, d_k, d_k, scale, nullptr, scores.data(), out + n * d + j * d_k);
    }
  });
}

// Encoder-decoder attention (§3.2.3): q (N, h·d_k), row n belongs to sentence n / beam;
// mem_k/mem_v (B, h, S, d_k) with strides ks/vs (3 each: sentence, head, key) in floats, the last
// dimension contiguous; visible (B, S) or null; out (N, h·d_k).
inline void cross_attention(const float* q, const float* mem_k, const float* mem_v, const int64_t* ks,
                            const int64_t* vs, const bool* visible, int64_t N, int64_t beam, int64_t h, int64_t S, int64_t d_k,
                            float scale, float* out) {
  const int64_t d = h * d_k;
  rows(N, h * S * d_k, [&](int64_t n) {
    thread_local std::vector<float> scores;
    scores.resize(S);
    const int64_t b = n / beam;
    for (int64_t j = 0; j < h; ++j) {
      attend_one(q + n * d + j * d_k, mem_k + b * ks[0] + j * ks[1], mem_v + b * vs[0] + j * vs[1], S, ks[2], vs[2],
                 d_k, scale,
                 visible != nullptr ? visible + b * S : nullptr, scores.data(), out + n * d + j * d_k);
    }
  });
}


// The k largest of x (n floats), best first, into val/idx (k each, k <= n): one pass that keeps a sorted
// list and, with AVX-512, skips 16 entries at a time when none beats the current k-th.
inline void row_topk(const float* x, int64_t n, int64_t k, float* val, int64_t* idx) {
  int64_t have = 0;
  auto offer = [&](float v, int64_t i) {
    if (have == k && !(v > val[k - 1])) return;
    int64_t p = have < k ? have++ : k - 1;
    while (p > 0 && v > val[p - 1]) val[p] = val[p - 1], idx[p] = idx[p - 1], --p;
    val[p] = v, idx[p] = i;
  };
  int64_t i = 0;
  for (; i < n && have < k; ++i) offer(x[i], i);
#if TRANSDUCE_VNNI
  for (; i + 16 <= n; i += 16) {
    __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), _mm512_set1_ps(val[k - 1]), _CMP_GT_OQ);
    while (m) {
      const int j = __builtin_ctz(m);
      offer(x[i + j], i + j);
      m &= m - 1;
    }
  }
#endif
  for (; i < n; ++i) offer(x[i], i);
}


// log Σ exp(x) over n floats: the max, then Σ exp(x - max) with a degree-6 polynomial exp under AVX-512
// (relative error ~1e-7 on the reduced range |r| <= ln2/2; std::exp elsewhere).
inline float logsumexp(const float* x, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if TRANSDUCE_VNNI
  __m512 m = _mm512_set1_ps(top);
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  top = _mm512_reduce_max_ps(m);
#endif
  for (; i < n; ++i) top = std::max(top, x[i]);
  if (top == -std::numeric_limits<float>::infinity()) return top;
  float total = 0.0f;
  i = 0;
#if TRANSDUCE_VNNI
  const __m512 vtop = _mm512_set1_ps(top), lo = _mm512_set1_ps(-87.0f), log2e = _mm512_set1_ps(1.44269504f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const float c[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vtop), lo);  // (-87, 0]
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(k, ln2_lo, _mm512_fnmadd_ps(k, ln2_hi, v));  // v - k·ln2
    __m512 p = _mm512_set1_ps(c[0]);
    for (int j = 1; j < 7; ++j) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[j]));
    acc = _mm512_add_ps(acc, _mm512_scalef_ps(p, k));  // p · 2^k
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) total += std::exp(x[i] - top);
  return top + std::log(total);
}

}  // namespace int8
