// Force-included first (g++ -include): the AVX2, FMA, AVX-512 and VNNI intrinsics that the decoder step's
// C++ uses, as SIMDe's portable implementations (Debian's libsimde-dev, built with SIMDE_NO_NATIVE), and
// the macros that tell vecmath.h and int8_gemm.h those levels are there: their vector code then runs,
// lane by lane, on a CPU without them (tests/test_backends_cpu_paths.py). A name missing below does not compile
// (the compiler's own AVX-512 functions refuse to inline into code built without -mavx512f).
#pragma once
// The compiler's headers first (torch includes <x86intrin.h>): including them again later does nothing,
// so the names defined below reach only transduce's code.
#include <x86intrin.h>
#include <cmath>
#include <cstdint>
#include <simde/x86/avx512.h>

// SIMDe's portable fused multiply-adds round twice (a·b, then + c); the instructions round once.
#define TRANSDUCE_FUSED(W, NAME, EXPR)                                                          \
  static inline simde__m##W NAME(simde__m##W a, simde__m##W b, simde__m##W c) {                \
    simde__m##W##_private a_ = simde__m##W##_to_private(a), b_ = simde__m##W##_to_private(b), \
                          c_ = simde__m##W##_to_private(c), r_;                                 \
    for (size_t i = 0; i < sizeof(r_.f32) / sizeof(float); ++i) {                               \
      const float x = a_.f32[i], y = b_.f32[i], z = c_.f32[i];                                  \
      r_.f32[i] = EXPR;                                                                         \
    }                                                                                           \
    return simde__m##W##_from_private(r_);                                                      \
  }
TRANSDUCE_FUSED(512, transduce_fmadd512, std::fma(x, y, z))
TRANSDUCE_FUSED(512, transduce_fmsub512, std::fma(x, y, -z))
TRANSDUCE_FUSED(512, transduce_fnmadd512, std::fma(-x, y, z))
TRANSDUCE_FUSED(256, transduce_fmadd256, std::fma(x, y, z))
TRANSDUCE_FUSED(256, transduce_fmsub256, std::fma(x, y, -z))
TRANSDUCE_FUSED(256, transduce_fnmadd256, std::fma(-x, y, z))
#undef TRANSDUCE_FUSED

// Not in SIMDe 0.7.4, each as Intel's intrinsics guide defines it. Float to int32: rounded to the nearest,
// ties to even (the default MXCSR), out of range INT32_MIN; masked lanes 0.
static inline simde__m512i transduce_maskz_cvtps_epi32(simde__mmask16 k, simde__m512 a) {
  simde__m512_private a_ = simde__m512_to_private(a);
  simde__m512i_private r_;
  for (int i = 0; i < 16; ++i) {
    const float x = std::nearbyint(a_.f32[i]);
    const bool fits = x >= -2147483648.0f && x < 2147483648.0f;
    r_.i32[i] = !((k >> i) & 1) ? 0 : fits ? static_cast<int32_t>(x) : INT32_MIN;
  }
  return simde__m512i_from_private(r_);
}
static inline simde__m512i transduce_cvtps_epi32(simde__m512 a) { return transduce_maskz_cvtps_epi32(0xffff, a); }
// Int32 to float, rounded to the nearest, ties to even.
static inline simde__m512 transduce_cvtepi32_ps(simde__m512i a) {
  simde__m512i_private a_ = simde__m512i_to_private(a);
  simde__m512_private r_;
  for (int i = 0; i < 16; ++i) r_.f32[i] = static_cast<float>(a_.i32[i]);
  return simde__m512_from_private(r_);
}
// Int32 to int8 by truncation: each element's low byte.
static inline simde__m128i transduce_cvtepi32_epi8(simde__m512i a) {
  simde__m512i_private a_ = simde__m512i_to_private(a);
  simde__m128i_private r_;
  for (int i = 0; i < 16; ++i) r_.i8[i] = static_cast<int8_t>(static_cast<uint32_t>(a_.i32[i]) & 0xff);
  return simde__m128i_from_private(r_);
}
// The lanes whose mask bit is set, stored; memory under the others untouched.
static inline void transduce_mask_storeu_ps(void* p, simde__mmask16 k, simde__m512 a) {
  simde__m512_private a_ = simde__m512_to_private(a);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) static_cast<float*>(p)[i] = a_.f32[i];
}
// The largest element (the inputs hold no NaN).
static inline float transduce_reduce_max_ps(simde__m512 a) {
  simde__m512_private a_ = simde__m512_to_private(a);
  float m = a_.f32[0];
  for (int i = 1; i < 16; ++i) m = m < a_.f32[i] ? a_.f32[i] : m;
  return m;
}

// The types and intrinsics transduce's C++ names, SIMDe's (or the functions above).
#define __m128 simde__m128
#define __m128i simde__m128i
#define __m256 simde__m256
#define __m256i simde__m256i
#define __m512 simde__m512
#define __m512d simde__m512d
#define __m512i simde__m512i
#define __mmask16 simde__mmask16
#define _mm256_add_epi32 simde_mm256_add_epi32
#define _mm256_add_ps simde_mm256_add_ps
#define _mm256_and_ps simde_mm256_and_ps
#define _mm256_and_si256 simde_mm256_and_si256
#define _mm256_andnot_ps simde_mm256_andnot_ps
#define _mm256_blendv_ps simde_mm256_blendv_ps
#define _mm256_castpd_ps simde_mm256_castpd_ps
#define _mm256_castps256_ps128 simde_mm256_castps256_ps128
#define _mm256_castps_si256 simde_mm256_castps_si256
#define _mm256_castsi256_ps simde_mm256_castsi256_ps
#define _mm256_cmp_ps simde_mm256_cmp_ps
#define _mm256_cvtepi32_ps simde_mm256_cvtepi32_ps
#define _mm256_cvtps_epi32 simde_mm256_cvtps_epi32
#define _mm256_div_ps simde_mm256_div_ps
#define _mm256_extractf128_ps simde_mm256_extractf128_ps
#define _mm256_fmadd_ps transduce_fmadd256
#define _mm256_fmsub_ps transduce_fmsub256
#define _mm256_fnmadd_ps transduce_fnmadd256
#define _mm256_loadu_ps simde_mm256_loadu_ps
#define _mm256_loadu_si256 simde_mm256_loadu_si256
#define _mm256_madd_epi16 simde_mm256_madd_epi16
#define _mm256_maddubs_epi16 simde_mm256_maddubs_epi16
#define _mm256_max_ps simde_mm256_max_ps
#define _mm256_min_ps simde_mm256_min_ps
#define _mm256_movemask_ps simde_mm256_movemask_ps
#define _mm256_mul_ps simde_mm256_mul_ps
#define _mm256_round_ps simde_mm256_round_ps
#define _mm256_set1_epi16 simde_mm256_set1_epi16
#define _mm256_set1_epi32 simde_mm256_set1_epi32
#define _mm256_set1_ps simde_mm256_set1_ps
#define _mm256_setzero_ps simde_mm256_setzero_ps
#define _mm256_setzero_si256 simde_mm256_setzero_si256
#define _mm256_sign_epi8 simde_mm256_sign_epi8
#define _mm256_slli_epi32 simde_mm256_slli_epi32
#define _mm256_store_ps simde_mm256_store_ps
#define _mm256_storeu_ps simde_mm256_storeu_ps
#define _mm256_sub_ps simde_mm256_sub_ps
#define _mm256_xor_ps simde_mm256_xor_ps
#define _mm512_abs_ps simde_mm512_abs_ps
#define _mm512_add_epi32 simde_mm512_add_epi32
#define _mm512_add_ps simde_mm512_add_ps
#define _mm512_castps512_ps256 simde_mm512_castps512_ps256
#define _mm512_castps_pd simde_mm512_castps_pd
#define _mm512_castps_si512 simde_mm512_castps_si512
#define _mm512_castsi512_ps simde_mm512_castsi512_ps
#define _mm512_cmp_ps_mask simde_mm512_cmp_ps_mask
#define _mm512_cvtepi32_epi8 transduce_cvtepi32_epi8
#define _mm512_cvtepi32_ps transduce_cvtepi32_ps
#define _mm512_cvtps_epi32 transduce_cvtps_epi32
#define _mm512_div_ps simde_mm512_div_ps
#define _mm512_dpbusd_epi32 simde_mm512_dpbusd_epi32
#define _mm512_extractf64x4_pd simde_mm512_extractf64x4_pd
#define _mm512_fmadd_ps transduce_fmadd512
#define _mm512_fmsub_ps transduce_fmsub512
#define _mm512_fnmadd_ps transduce_fnmadd512
#define _mm512_loadu_ps simde_mm512_loadu_ps
#define _mm512_loadu_si512 simde_mm512_loadu_si512
#define _mm512_mask_blend_ps simde_mm512_mask_blend_ps
#define _mm512_mask_storeu_ps transduce_mask_storeu_ps
#define _mm512_maskz_cvtps_epi32 transduce_maskz_cvtps_epi32
#define _mm512_maskz_mul_ps simde_mm512_maskz_mul_ps
#define _mm512_max_ps simde_mm512_max_ps
#define _mm512_min_ps simde_mm512_min_ps
#define _mm512_mul_ps simde_mm512_mul_ps
#define _mm512_reduce_max_ps transduce_reduce_max_ps
#define _mm512_roundscale_ps simde_mm512_roundscale_ps
#define _mm512_set1_epi32 simde_mm512_set1_epi32
#define _mm512_set1_ps simde_mm512_set1_ps
#define _mm512_setzero_ps simde_mm512_setzero_ps
#define _mm512_setzero_si512 simde_mm512_setzero_si512
#define _mm512_slli_epi32 simde_mm512_slli_epi32
#define _mm512_storeu_ps simde_mm512_storeu_ps
#define _mm512_sub_epi32 simde_mm512_sub_epi32
#define _mm512_sub_ps simde_mm512_sub_ps
#define _mm512_xor_si512 simde_mm512_xor_si512
#define _mm_add_ps simde_mm_add_ps
#define _mm_add_ss simde_mm_add_ss
#define _mm_cvtss_f32 simde_mm_cvtss_f32
#define _mm_max_ps simde_mm_max_ps
#define _mm_max_ss simde_mm_max_ss
#define _mm_movehdup_ps simde_mm_movehdup_ps
#define _mm_movehl_ps simde_mm_movehl_ps
#define _mm_storeu_si128 simde_mm_storeu_si128

#define __AVX2__ 1
#define __FMA__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#ifdef TRANSDUCE_EMULATE_VNNI
#define __AVX512VNNI__ 1
#endif
