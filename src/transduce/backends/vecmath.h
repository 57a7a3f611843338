// fp32 loops over short arrays for the int8 step (int8_step.h): dot products, sums, max, exp, log Σ exp,
// GELU, Swish and the threshold scan of a row's top-k.
//
// One numerics on every instruction set. The file is compiled once per SIMD level (cpp.py: "scalar",
// "avx2", "avx512", "avx512vnni"; the level is picked at run time from the CPU), and every level returns
// the same bits for the same inputs:
// - element-wise functions (exp, GELU, Swish) are one sequence of IEEE operations, written once as scalar
//   code (`exp1`, `gelu1`, `swish1`) and once per vector width with the same constants, the same fused
//   multiply-adds (std::fma where the vectors use vfmadd) and the same rounding;
// - reductions (sums, dot products, Σ exp) run in one fixed order: 16 running partial sums (lane j takes
//   elements j, j + 16, ...), folded 16 → 8 → 4 → 2 → 1 as (j, j + 8), (j, j + 4), (j, j + 2), (0, 1),
//   then the elements past the last multiple of 16 added one by one. AVX-512 holds the 16 lanes in one
//   register, AVX2 in two, the scalar path in an array;
// - cpp.py compiles with -ffp-contract=off, so the compiler fuses nothing on its own.
// Each function reads one row (one sentence's beam, one head) and nothing else, so its result does not
// depend on the batch either. std::log (once per row, in log Σ exp) is the C library's.
//
// Accuracy against the exact functions (float64 references, tests/test_backends_cpu_paths.py): exp within 1e-7
// relative (a degree-6 minimax polynomial on |r| <= ln2/2); GELU within 5e-7 relative everywhere, its
// negative tail included (Φ(x) = Q(|x|) for x < 0 is computed directly, never as 1 - (1 - Q)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// The SIMD level this file was compiled for (cpp.py's names).
inline const char* level() {
#if TRANSDUCE_ZMM
  return "avx512";
#elif TRANSDUCE_YMM
  return "avx2";
#else
  return "scalar";
#endif
}

// ----------------------------------------------------------------------------- constants
// e^v: v = k·ln2 + r (ln2 in two parts, Cody & Waite), |r| <= ln2/2, e^r by a degree-6 minimax polynomial
// (relative error 2e-9 in exact arithmetic), 2^k written into the exponent bits. v < -87 (e^v under fp32's
// smallest normal, -inf included): 0; v > 88: e^88.
constexpr float EXP_LO = -87.0f, EXP_HI = 88.0f, LOG2E = 1.44269504f;
constexpr float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float EXP_C[7] = {1.0f, 1.0f, 4.999999e-01f, 1.6666406e-01f, 4.1668225e-02f, 8.375836e-03f,
                            1.3840155e-03f};  // c0 + c1 r + ... + c6 r^6

// GELU(x) = x Φ(x). The upper tail Q(a) = 1 - Φ(a) = erfc(a/√2)/2 for a = |x| is e^(-a²/2) · t·P(t) with
// t = 1/(1 + 0.3 a) and P of degree 9, fitted for relative error (3.8e-9 in exact arithmetic over
// 0 <= a <= 14). a² is carried as hi + lo (fma), so e^(-a²/2) keeps its relative accuracy where a² is
// large. Φ(x) = Q(|x|) for x < 0 (no cancellation) and 1 - Q(x) for x >= 0.
constexpr float GELU_T = 0.3f;
constexpr float GELU_C[10] = {1.19686924e-01f, 1.1956735e-01f, 1.1027092e-01f, 7.823371e-02f,  9.6574865e-02f,
                              -8.013412e-02f,  1.9255188e-01f, -2.2872153e-01f, 1.1262254e-01f, -2.0652534e-02f};

// ----------------------------------------------------------------------------- scalar reference
inline float exp1(float v) {
  if (!(v >= EXP_LO)) return 0.0f;
  v = std::min(v, EXP_HI);
  const float k = std::nearbyint(v * LOG2E);
  const float r = std::fma(-k, LN2_LO, std::fma(-k, LN2_HI, v));
  float p = EXP_C[6];
  for (int j = 5; j >= 0; --j) p = std::fma(p, r, EXP_C[j]);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23;
  float two_k;
  std::memcpy(&two_k, &bits, 4);
  return p * two_k;
}

inline float gelu1(float x) {
  const float a = std::fabs(x), hi = a * a, lo = std::fma(a, a, -hi);  // a² = hi + lo exactly
  const float e0 = exp1(hi * -0.5f), e = std::fma(e0, lo * -0.5f, e0);  // e^(-a²/2)
  const float t = 1.0f / std::fma(a, GELU_T, 1.0f);
  float p = GELU_C[9];
  for (int j = 8; j >= 0; --j) p = std::fma(p, t, GELU_C[j]);
  const float q = (p * t) * e;  // Q(a)
  return x * (x < 0.0f ? q : 1.0f - q);
}

inline float swish1(float x) { return x / (1.0f + exp1(-x)); }  // x σ(x)

// The fixed reduction order over 16 partial sums (file comment).
inline float fold16(const float* acc) {
  float v8[8], v4[4];
  for (int j = 0; j < 8; ++j) v8[j] = acc[j] + acc[j + 8];
  for (int j = 0; j < 4; ++j) v4[j] = v8[j] + v8[j + 4];
  return (v4[0] + v4[2]) + (v4[1] + v4[3]);
}

// ----------------------------------------------------------------------------- vectors
#if TRANSDUCE_YMM
// The 16 partial sums held as lanes 0-7 and 8-15, folded as fold16.
inline float fold16(__m256 lo, __m256 hi) {
  const __m256 v8 = _mm256_add_ps(lo, hi);
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));  // (0 + 2, 1 + 3)
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

inline __m256 exp8(__m256 v) {
  const __m256 live = _mm256_cmp_ps(v, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
  v = _mm256_min_ps(v, _mm256_set1_ps(EXP_HI));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), v));
  __m256 p = _mm256_set1_ps(EXP_C[6]);
  for (int j = 5; j >= 0; --j) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C[j]));
  const __m256i live_k = _mm256_and_si256(_mm256_castps_si256(live), _mm256_cvtps_epi32(k));  // masked: no overflow
  const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(live_k, _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(two_k)), live);
}

inline __m256 gelu8(__m256 x) {
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 hi = _mm256_mul_ps(a, a), lo = _mm256_fmsub_ps(a, a, hi);
  const __m256 e0 = exp8(_mm256_mul_ps(hi, _mm256_set1_ps(-0.5f)));
  const __m256 e = _mm256_fmadd_ps(e0, _mm256_mul_ps(lo, _mm256_set1_ps(-0.5f)), e0);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(a, _mm256_set1_ps(GELU_T), one));
  __m256 p = _mm256_set1_ps(GELU_C[9]);
  for (int j = 8; j >= 0; --j) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(GELU_C[j]));
  const __m256 q = _mm256_mul_ps(_mm256_mul_ps(p, t), e);
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_mul_ps(x, _mm256_blendv_ps(_mm256_sub_ps(one, q), q, negative));
}

inline __m256 swish8(__m256 x) {
  const __m256 e = exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));  // e^-x
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
#endif

#if TRANSDUCE_ZMM
inline float fold16(__m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return fold16(_mm512_castps512_ps256(v), hi);
}

inline __m512 exp16(__m512 v) {
  const __mmask16 live = _mm512_cmp_ps_mask(v, _mm512_set1_ps(EXP_LO), _CMP_GE_OQ);
  v = _mm512_min_ps(v, _mm512_set1_ps(EXP_HI));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_LO), _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_HI), v));
  __m512 p = _mm512_set1_ps(EXP_C[6]);
  for (int j = 5; j >= 0; --j) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C[j]));
  const __m512i k_int = _mm512_maskz_cvtps_epi32(live, k);
  const __m512i two_k = _mm512_slli_epi32(_mm512_add_epi32(k_int, _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(live, p, _mm512_castsi512_ps(two_k));
}

inline __m512 gelu16(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 hi = _mm512_mul_ps(a, a), lo = _mm512_fmsub_ps(a, a, hi);
  const __m512 e0 = exp16(_mm512_mul_ps(hi, _mm512_set1_ps(-0.5f)));
  const __m512 e = _mm512_fmadd_ps(e0, _mm512_mul_ps(lo, _mm512_set1_ps(-0.5f)), e0);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(a, _mm512_set1_ps(GELU_T), one));
  __m512 p = _mm512_set1_ps(GELU_C[9]);
  for (int j = 8; j >= 0; --j) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(GELU_C[j]));
  const __m512 q = _mm512_mul_ps(_mm512_mul_ps(p, t), e);
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mul_ps(x, _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, q), q));
}

inline __m512 swish16(__m512 x) {
  const __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));  // e^-x
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#endif

// ----------------------------------------------------------------------------- reductions
// Σ a·b over n floats (each product fused into its partial sum).
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if TRANSDUCE_ZMM
  if (n >= 16) {
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = fold16(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 16) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    s = fold16(lo, hi);
  }
#else
  if (n >= 16) {
    float acc[16] = {};
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] = std::fma(a[i + j], b[i + j], acc[j]);
    s = fold16(acc);
  }
#endif
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
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
    s = fold16(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 16) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(a + i));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(a + i + 8));
    }
    s = fold16(lo, hi);
  }
#else
  if (n >= 16) {
    float acc[16] = {};
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += a[i + j];
    s = fold16(acc);
  }
#endif
  for (; i < n; ++i) s += a[i];
  return s;
}

// Σ (a - c)² over n floats (with c the mean: n · variance), each square fused into its partial sum.
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
    s = fold16(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 16) {
    const __m256 vc = _mm256_set1_ps(c);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m256 v0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), vc), v1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), vc);
      lo = _mm256_fmadd_ps(v0, v0, lo);
      hi = _mm256_fmadd_ps(v1, v1, hi);
    }
    s = fold16(lo, hi);
  }
#else
  if (n >= 16) {
    float acc[16] = {};
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) {
        const float v = a[i + j] - c;
        acc[j] = std::fma(v, v, acc[j]);
      }
    s = fold16(acc);
  }
#endif
  for (; i < n; ++i) {
    const float v = a[i] - c;
    s = std::fma(v, v, s);
  }
  return s;
}

// max of n floats (-inf for none); exact, so any order gives the same value.
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
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    top = _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
  }
#endif
  for (; i < n; ++i) top = std::max(top, x[i]);
  return top;
}

// Σ e^(x[i] - shift) over n floats (shift >= every x[i]: the max); with store, x[i] <- e^(x[i] - shift) too
// (softmax's numerators).
template <bool store>
inline float exp_sum_impl(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float total = 0.0f;
#if TRANSDUCE_ZMM
  if (n >= 16) {
    const __m512 c = _mm512_set1_ps(shift);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), c));
      if (store) _mm512_storeu_ps(x + i, e);
      acc = _mm512_add_ps(acc, e);
    }
    total = fold16(acc);
  }
#elif TRANSDUCE_YMM
  if (n >= 16) {
    const __m256 c = _mm256_set1_ps(shift);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), c));
      const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), c));
      if (store) _mm256_storeu_ps(x + i, e0), _mm256_storeu_ps(x + i + 8, e1);
      lo = _mm256_add_ps(lo, e0);
      hi = _mm256_add_ps(hi, e1);
    }
    total = fold16(lo, hi);
  }
#else
  if (n >= 16) {
    float acc[16] = {};
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) {
        const float e = exp1(x[i + j] - shift);
        if (store) x[i + j] = e;
        acc[j] += e;
      }
    total = fold16(acc);
  }
#endif
  for (; i < n; ++i) {
    const float e = exp1(x[i] - shift);
    if (store) x[i] = e;
    total += e;
  }
  return total;
}

// x[i] <- e^(x[i] - shift) over n floats; returns their sum (softmax's numerators and denominator).
inline float exp_shifted(float* x, int64_t n, float shift) { return exp_sum_impl<true>(x, n, shift); }

// Σ e^(x[i] - shift) over n floats (shift >= every x[i]: the max).
inline float exp_sum(const float* x, int64_t n, float shift) {
  return exp_sum_impl<false>(const_cast<float*>(x), n, shift);
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
    if (m > top) total = top == NEG_INF ? 0.0f : total * exp1(top - m), top = m;
    if (top != NEG_INF) total += exp_sum(x, n, top);
  }

  float value() const { return top == NEG_INF ? top : top + std::log(total); }
};

// ----------------------------------------------------------------------------- element-wise
// x[i] <- f(x[i]) over n floats: 16 or 8 lanes at a time, the rest with the scalar reference.
#define TRANSDUCE_ELEMENTWISE(name)                                                           \
  inline void name(float* x, int64_t n) {                                                    \
    int64_t i = 0;                                                                          \
    TRANSDUCE_ELEMENTWISE_Z(name)                                                           \
    TRANSDUCE_ELEMENTWISE_Y(name)                                                           \
    for (; i < n; ++i) x[i] = name##1(x[i]);                                                \
  }
#if TRANSDUCE_ZMM
#define TRANSDUCE_ELEMENTWISE_Z(name) \
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, name##16(_mm512_loadu_ps(x + i)));
#else
#define TRANSDUCE_ELEMENTWISE_Z(name)
#endif
#if TRANSDUCE_YMM
#define TRANSDUCE_ELEMENTWISE_Y(name) \
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, name##8(_mm256_loadu_ps(x + i)));
#else
#define TRANSDUCE_ELEMENTWISE_Y(name)
#endif

TRANSDUCE_ELEMENTWISE(gelu)   // x[i] <- GELU(x[i]) = x Φ(x), the exact erf form (torch's default)
TRANSDUCE_ELEMENTWISE(swish)  // x[i] <- x σ(x) (torch's SiLU)

#undef TRANSDUCE_ELEMENTWISE
#undef TRANSDUCE_ELEMENTWISE_Z
#undef TRANSDUCE_ELEMENTWISE_Y

// The first index in [i, n) whose x exceeds `threshold`, or n: a row's top-k scan skips the entries that
// cannot enter (16 at a time with AVX-512 or AVX2). Comparisons only: the same answer on every path.
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
