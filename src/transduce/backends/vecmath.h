// fp32 loops over short arrays for the int8 step (int8_step.h): dot products, sums, max, exp, log Σ exp,
// GELU's erf and the threshold scan of a row's top-k, vectorised with AVX-512 or AVX2 + FMA where the
// compiler targets them (cpp.py builds with -march=native), plain loops elsewhere.
//
// Each function reads one row (one sentence's beam, one head) and nothing else, so its result does not
// depend on the batch. The vector versions sum in another order than the plain loops and use polynomial
// exp and erf (relative error about 1e-7, fp32's own rounding): an approximation of the same functions,
// as the int8 step is of fp32 (it does not promise fp32's bits).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#define TRANSDUCE_ZMM 1
#else
#define TRANSDUCE_ZMM 0
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define TRANSDUCE_YMM 1
#else
#define TRANSDUCE_YMM 0
#endif

namespace vec {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

#if TRANSDUCE_YMM
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// e^v, 8 lanes: v = k·ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error
// about 1e-7), 2^k written into the exponent bits. Below -87 (e^v under fp32's smallest normal, -inf
// included): 0; above 88: e^88.
inline __m256 exp(__m256 v) {
  const __m256 live = _mm256_cmp_ps(v, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), v));
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(two_k)), live);
}

// x Φ(x) = x (1 + erf(x/√2)) / 2, 8 lanes; erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7).
inline __m256 gelu(__m256 x) {
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678f));
  const __m256 sign = _mm256_and_ps(z, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);  // |z|
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(a, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  const __m256 e = exp(_mm256_mul_ps(_mm256_mul_ps(a, a), _mm256_set1_ps(-1.0f)));
  const __m256 erf = _mm256_or_ps(_mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.0f)), sign);  // sign(z)(1 - p e)
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), erf));
}
#endif

// Σ a·b over n floats.
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_ZMM
  if (n >= 16) {
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 8) {
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = hsum(acc);
  }
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Σ a over n floats.
inline float sum(const float* a, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_ZMM
  if (n >= 16) {
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(a + i));
    s = _mm512_reduce_add_ps(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 8) {
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(a + i));
    s = hsum(acc);
  }
#endif
  for (; i < n; ++i) s += a[i];
  return s;
}

// Σ (a - c)² over n floats (with c the mean: n · variance).
inline float sum_squares(const float* a, float c, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_ZMM
  if (n >= 16) {
    const __m512 vc = _mm512_set1_ps(c);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_sub_ps(_mm512_loadu_ps(a + i), vc);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    s = _mm512_reduce_add_ps(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 8) {
    const __m256 vc = _mm256_set1_ps(c);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(a + i), vc);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    s = hsum(acc);
  }
#endif
  for (; i < n; ++i) s += (a[i] - c) * (a[i] - c);
  return s;
}

// max of n floats (-inf for none).
inline float max(const float* x, int64_t n) {
  float top = NEG_INF;
  int64_t i = 0;
#if TRANSDUCE_ZMM
  if (n >= 16) {
    __m512 m = _mm512_set1_ps(top);
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    top = _mm512_reduce_max_ps(m);
  }
#elif TRANSDUCE_YMM
  if (n >= 8) {
    __m256 m = _mm256_set1_ps(top);
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    top = hmax(m);
  }
#endif
  for (; i < n; ++i) top = std::max(top, x[i]);
  return top;
}

// x[i] <- e^(x[i] - shift) over n floats; returns their sum (softmax's numerators and denominator).
inline float exp_shifted(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float total = 0.0f;
#if TRANSDUCE_YMM
  if (n >= 8) {
    const __m256 c = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m256 e = exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), c));
      _mm256_storeu_ps(x + i, e);
      acc = _mm256_add_ps(acc, e);
    }
    total = hsum(acc);
  }
#endif
  for (; i < n; ++i) total += x[i] = std::exp(x[i] - shift);
  return total;
}

// Σ e^(x[i] - shift) over n floats (shift >= every x[i]: the max). AVX-512: a degree-6 polynomial exp on
// the reduced range |r| <= ln2/2 (relative error ~1e-7), scaled by 2^k; AVX2: exp above; std::exp elsewhere.
inline float exp_sum(const float* x, int64_t n, float shift) {
  float total = 0.0f;
  int64_t i = 0;
#if TRANSDUCE_ZMM
  const __m512 vtop = _mm512_set1_ps(shift), lo = _mm512_set1_ps(-87.0f), log2e = _mm512_set1_ps(1.44269504f);
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
#elif TRANSDUCE_YMM
  const __m256 vtop = _mm256_set1_ps(shift);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {  // two independent chains
    acc0 = _mm256_add_ps(acc0, exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vtop)));
    acc1 = _mm256_add_ps(acc1, exp(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vtop)));
  }
  total = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) total += std::exp(x[i] - shift);
  return total;
}

// log Σ exp(x) over n floats: the max, then exp_sum.
inline float logsumexp(const float* x, int64_t n) {
  const float top = max(x, n);
  if (top == NEG_INF) return top;
  return top + std::log(exp_sum(x, n, top));
}

// log Σ exp over a row read in pieces: a running max, the sum rescaled when the max grows.
struct LogSumExp {
  float top = NEG_INF, total = 0.0f;

  void add(const float* x, int64_t n) {
    const float m = max(x, n);
    if (m > top) total = top == NEG_INF ? 0.0f : total * std::exp(top - m), top = m;
    if (top != NEG_INF) total += exp_sum(x, n, top);
  }

  float value() const { return top == NEG_INF ? top : top + std::log(total); }
};

// x[i] <- GELU(x[i]) = x Φ(x) over n floats (the exact erf form, as torch's default).
inline void gelu(float* x, int64_t n) {
  int64_t i = 0;
#if TRANSDUCE_YMM
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, gelu(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678f));
}

// The first index in [i, n) whose x exceeds `threshold`, or n: a row's top-k scan skips the entries that
// cannot enter (16 at a time with AVX-512 or AVX2).
inline int64_t next_above(const float* x, int64_t i, int64_t n, float threshold) {
#if TRANSDUCE_ZMM
  const __m512 t = _mm512_set1_ps(threshold);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), t, _CMP_GT_OQ);
    if (m) return i + __builtin_ctz(m);
  }
#elif TRANSDUCE_YMM
  const __m256 t = _mm256_set1_ps(threshold);
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GT_OQ);
    const __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), t, _CMP_GT_OQ);
    const int m = _mm256_movemask_ps(a) | (_mm256_movemask_ps(b) << 8);
    if (m) return i + __builtin_ctz(m);
  }
#endif
  for (; i < n; ++i)
    if (x[i] > threshold) return i;
  return n;
}

}  // namespace vec
