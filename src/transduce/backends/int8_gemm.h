// y = x Wᵀ + b in int8 for the decoder step's few rows (a batch of beams), with exact int32 sums.
//
// Weights: quantised once, per output channel, symmetric: w_q = round(W / s_w), s_w = max|W_o| / 127.
// Activations: quantised per call, per row, symmetric: x_q = round(x / s_x), s_x = max|x_r| / 127.
// y = s_x · s_w · Σ x_q w_q + b. Every row has its own scale and the sums are exact, so a row's output
// does not depend on the other rows of the call (int8 decoding stays batch-invariant), and the AVX-512
// VNNI kernel, the AVX2 kernel (CPUs without VNNI) and the portable loop return the same bits: the same
// int32 sums, then one fused multiply-add (s_x · s_w) · sum + b on every path.
//
// Why not fbgemm's int8 GEMM (at::fbgemm_linear_int8_weight_fp32_activation)? At 4 rows (batch 1,
// beam 4) it spends ~13 µs per call on quantising, packing and requantising around a GEMM of a few
// hundred thousand multiply-adds; a step makes 25 calls. This kernel does the same work in a few µs.
//
// VNNI layout. vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds them into one int32
// lane, 16 lanes at a time. Weights are packed as (N/16, K/4, 16, 4): for 16 outputs and 4 inputs,
// one 64-byte vector. x_q is stored as unsigned bytes x_q + 128; the 128 · Σ_k w_q[o, k] this adds is
// subtracted once per output (`wsum`).
#pragma once

// ATen's tensor type and ops one header each, not <torch/extension.h> (native_step.cpp says why).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define TRANSDUCE_VNNI 1
#ifndef TRANSDUCE_NB
#define TRANSDUCE_NB 2
#endif
#else
#define TRANSDUCE_VNNI 0
#endif
#if !TRANSDUCE_VNNI && defined(__AVX2__)
#include <immintrin.h>
#define TRANSDUCE_AVX2 1
#else
#define TRANSDUCE_AVX2 0
#endif

namespace int8 {

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// A linear map's weights, quantised and packed once.
struct Weights {
  int64_t in = 0, out = 0;   // K, N
  int64_t k4 = 0, n16 = 0;   // K rounded up to 4, N rounded up to 16
  std::vector<int8_t> packed;  // (n16/16, k4/4, 16, 4)
  std::vector<int32_t> wsum;   // (n16,) Σ_k w_q[o, k]
  std::vector<float> scale;    // (n16,) s_w per output
  std::vector<float> bias;     // (n16,) zeros where the map has none

  // w (N, K) float, bias (N,) or undefined.
  Weights(const at::Tensor& w, const at::Tensor& b) {
    at::Tensor w32 = w.detach().to(at::kFloat).contiguous();
    out = w32.size(0), in = w32.size(1);
    k4 = round_up(in, 4), n16 = round_up(out, 16);
    packed.assign(n16 * k4, 0), wsum.assign(n16, 0), scale.assign(n16, 1.0f), bias.assign(n16, 0.0f);
    const float* W = w32.data_ptr<float>();
    for (int64_t o = 0; o < out; ++o) {
      const float* row = W + o * in;
      float amax = 0.0f;
      for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
      scale[o] = s;
      for (int64_t k = 0; k < in; ++k) {
        const int8_t q = static_cast<int8_t>(std::nearbyint(row[k] / s));  // |q| <= 127
        packed[((o / 16) * (k4 / 4) + k / 4) * 64 + (o % 16) * 4 + k % 4] = q;
        wsum[o] += q;
      }
    }
    if (b.defined()) {
      at::Tensor b32 = b.detach().to(at::kFloat).contiguous();
      std::copy(b32.data_ptr<float>(), b32.data_ptr<float>() + out, bias.begin());
    }
  }

  int8_t at(int64_t o, int64_t k) const { return packed[((o / 16) * (k4 / 4) + k / 4) * 64 + (o % 16) * 4 + k % 4]; }
};

// A row of x (K floats) -> k4 unsigned bytes x_q + 128 (padding: 128, i.e. zero); returns s_x.
// Both versions round x · (1 / s_x) to nearest even, so they give the same bytes.
inline float quantize_row(const float* x, int64_t K, int64_t k4, uint8_t* q, bool portable) {
  int64_t k = 0;
  float amax = 0.0f;
#if TRANSDUCE_VNNI
  if (!portable) {
    __m512 m = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
    amax = _mm512_reduce_max_ps(m);
  }
#elif TRANSDUCE_AVX2
  if (!portable) {  // the maximum is exact: the same value in any order
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    for (float v : lanes) amax = std::max(amax, v);
  }
#endif
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / s;
  k = 0;
#if TRANSDUCE_VNNI
  if (!portable) {
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i offset = _mm512_set1_epi32(128);
    for (; k + 16 <= K; k += 16) {
      __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv)), offset);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(v));
    }
  }
#elif TRANSDUCE_AVX2
  if (!portable) {  // vcvtps2dq rounds to nearest even, as nearbyint in the default rounding mode
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i offset = _mm256_set1_epi32(128);
    for (; k + 8 <= K; k += 8) {
      const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv)), offset);
      const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));  // 1..255
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packus_epi16(w16, w16));
    }
  }
#endif
  for (; k < K; ++k) q[k] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(x[k] * inv)) + 128);
  for (k = K; k < k4; ++k) q[k] = 128;
  return s;
}

// The rows of x quantised for one map (quantize_row): x_q + 128 (k4 bytes a row) and the scales; for the
// AVX2 kernel also the signed x_q and |x_q|.
struct Quantized {
  int64_t rows = 0, k4 = 0;
  bool portable = false;
  std::vector<uint8_t> xq;
  std::vector<float> sx;
  std::vector<int8_t> xs;  // AVX2 only
  std::vector<uint8_t> xa;  // AVX2 only

  // x (M, w.in) row-major floats. portable: for the plain loop even where a SIMD kernel is compiled in.
  Quantized(const float* x, int64_t M, const Weights& w, bool portable = false)
      : rows(M), k4(w.k4), portable(portable), xq(M * w.k4), sx(M) {
    for (int64_t r = 0; r < M; ++r) sx[r] = quantize_row(x + r * w.in, w.in, w.k4, xq.data() + r * w.k4, portable);
#if TRANSDUCE_AVX2
    if (portable) return;
    xs.resize(M * k4), xa.resize(M * k4);
    int64_t i = 0;
    const __m256i offset = _mm256_set1_epi8(static_cast<char>(128));
    for (; i + 32 <= M * k4; i += 32) {  // x_q = (x_q + 128) - 128 and |x_q|, 32 bytes at a time
      const __m256i v = _mm256_sub_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.data() + i)), offset);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xs.data() + i), v);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xa.data() + i), _mm256_abs_epi8(v));
    }
    for (; i < M * k4; ++i) {
      const int32_t v = static_cast<int32_t>(xq[i]) - 128;
      xs[i] = static_cast<int8_t>(v), xa[i] = static_cast<uint8_t>(v < 0 ? -v : v);
    }
#endif
  }
};

// Each kernel below computes the outputs of rows [r0, r1) and 16-wide column blocks [b0, b1) into y, which
// points at row r0's column b0 · 16 with rows `ldy` floats apart; columns past w.out are not written.

// The portable loop.
inline void block_portable(const Weights& w, const Quantized& q, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                           float* y, int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* x = q.xq.data() + r * w.k4;
    for (int64_t o = b0 * 16; o < std::min(b1 * 16, w.out); ++o) {
      int32_t acc = 0;
      for (int64_t k = 0; k < w.k4; ++k) acc += static_cast<int32_t>(x[k]) * w.at(o, k);
      y[(r - r0) * ldy + o - b0 * 16] =
          std::fma(static_cast<float>(acc - 128 * w.wsum[o]), q.sx[r] * w.scale[o], w.bias[o]);  // as vfmadd
    }
  }
}

#if TRANSDUCE_VNNI
// A tile of R rows (R <= 4) by NB blocks of 16 outputs: R·NB independent accumulators hide vpdpbusd's
// latency, each weight vector is loaded once for R rows and each broadcast of x once for NB blocks.
// xq, sx: the tile's first row; y: its first output.
template <int R, int NB>
inline void tile_vnni(const Weights& w, const uint8_t* xq, const float* sx, float* y, int64_t ldy, int64_t nb) {
  const int64_t groups = w.k4 / 4;
  __m512i acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_si512();
  const int8_t* panel = w.packed.data() + nb * groups * 64;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(panel + (j * groups + g) * 64);  // 16 outputs x 4 inputs
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, xq + r * w.k4 + g * 4, 4);
      const __m512i xv = _mm512_set1_epi32(four);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xv, wv[j]);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int64_t o = (nb + j) * 16;
    const __m512i wsum = _mm512_slli_epi32(_mm512_loadu_si512(w.wsum.data() + o), 7);  // 128 · Σ_k w_q
    const __m512 scale = _mm512_loadu_ps(w.scale.data() + o), bias = _mm512_loadu_ps(w.bias.data() + o);
    const __mmask16 live = o + 16 <= w.out ? 0xFFFF : static_cast<__mmask16>((1u << (w.out - o)) - 1);
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], wsum));
      v = _mm512_fmadd_ps(v, _mm512_mul_ps(_mm512_set1_ps(sx[r]), scale), bias);
      _mm512_mask_storeu_ps(y + r * ldy + j * 16, live, v);
    }
  }
}

// Every row for one tile of NB blocks starting at block nb: the tile's weights stay in L1 for every row.
template <int NB>
inline void rows_vnni(const Weights& w, const Quantized& q, int64_t r0, int64_t r1, float* y, int64_t ldy,
                      int64_t nb) {
  const uint8_t* xq = q.xq.data();
  const float* sx = q.sx.data();
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) tile_vnni<4, NB>(w, xq + r * w.k4, sx + r, y + (r - r0) * ldy, ldy, nb);
  switch (r1 - r) {
    case 3: tile_vnni<3, NB>(w, xq + r * w.k4, sx + r, y + (r - r0) * ldy, ldy, nb); break;
    case 2: tile_vnni<2, NB>(w, xq + r * w.k4, sx + r, y + (r - r0) * ldy, ldy, nb); break;
    case 1: tile_vnni<1, NB>(w, xq + r * w.k4, sx + r, y + (r - r0) * ldy, ldy, nb); break;
    default: break;
  }
}

inline void block_vnni(const Weights& w, const Quantized& q, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                       float* y, int64_t ldy) {
  constexpr int NB = TRANSDUCE_NB;
  int64_t nb = b0;
  for (; nb + NB <= b1; nb += NB) rows_vnni<NB>(w, q, r0, r1, y + (nb - b0) * 16, ldy, nb);
  for (; nb < b1; ++nb) rows_vnni<1>(w, q, r0, r1, y + (nb - b0) * 16, ldy, nb);
}
#endif

#if TRANSDUCE_AVX2
// AVX2 without VNNI: vpmaddubsw multiplies unsigned by signed bytes into saturating int16 pairs. With
// the signed x_q and |x_q|, w_q <= 127, |x|·sign(w, x) makes each pair at most 2·127·127 = 32,258 < 32,767,
// so nothing saturates; vpmaddwd by 1 sums the pairs into int32. The sums are Σ x_q w_q exactly (no
// 128 · wsum correction): the same values as the other kernels. xs, xa: the tile's first row's signed
// x_q and |x_q| (Quantized), broadcast 4 bytes at a time; y: the tile's first output.
template <int R>
inline void tile_avx2(const Weights& w, const int8_t* xs, const uint8_t* xa, const float* sx, float* y, int64_t ldy,
                      int64_t nb) {
  const int64_t groups = w.k4 / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const int8_t* panel = w.packed.data() + nb * groups * 64;
  for (int64_t g = 0; g < groups; ++g) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + g * 64));       // outputs 0-7
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + g * 64 + 32));  // outputs 8-15
    for (int r = 0; r < R; ++r) {
      int32_t s4, a4;
      std::memcpy(&s4, xs + r * w.k4 + g * 4, 4);
      std::memcpy(&a4, xa + r * w.k4 + g * 4, 4);
      const __m256i sv = _mm256_set1_epi32(s4), av = _mm256_set1_epi32(a4);  // 4 bytes of the row, repeated
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(w0, sv)), ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(w1, sv)), ones));
    }
  }
  const int64_t o = nb * 16, live = std::min<int64_t>(16, w.out - o);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[16];
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(sx[r]), _mm256_loadu_ps(w.scale.data() + o + 8 * h));
      _mm256_store_ps(v + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), scale,
                                                 _mm256_loadu_ps(w.bias.data() + o + 8 * h)));
    }
    std::memcpy(y + r * ldy, v, live * sizeof(float));
  }
}

inline void block_avx2(const Weights& w, const Quantized& q, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                       float* y, int64_t ldy) {
  const int8_t* xs = q.xs.data();
  const uint8_t* xa = q.xa.data();
  const float* sx = q.sx.data();
  for (int64_t nb = b0; nb < b1; ++nb) {
    float* yb = y + (nb - b0) * 16;
    int64_t r = r0;  // 3 rows a tile: 6 accumulators, 2 weights and the broadcasts fit AVX2's 16 registers
    for (; r + 3 <= r1; r += 3) tile_avx2<3>(w, xs + r * w.k4, xa + r * w.k4, sx + r, yb + (r - r0) * ldy, ldy, nb);
    const int8_t* s = xs + r * w.k4;
    const uint8_t* a = xa + r * w.k4;
    switch (r1 - r) {
      case 2: tile_avx2<2>(w, s, a, sx + r, yb + (r - r0) * ldy, ldy, nb); break;
      case 1: tile_avx2<1>(w, s, a, sx + r, yb + (r - r0) * ldy, ldy, nb); break;
      default: break;
    }
  }
}
#endif

inline bool has_vnni() { return TRANSDUCE_VNNI; }
inline bool has_avx2_kernel() { return TRANSDUCE_AVX2; }

// Rows [r0, r1) by 16-wide column blocks [b0, b1) of x Wᵀ + b into y (at row r0, column b0 · 16; rows ldy
// apart), with the CPU's kernel (the plain loop if q was quantised `portable`).
inline void block(const Weights& w, const Quantized& q, int64_t r0, int64_t r1, int64_t b0, int64_t b1, float* y,
                  int64_t ldy) {
#if TRANSDUCE_VNNI
  if (!q.portable) return block_vnni(w, q, r0, r1, b0, b1, y, ldy);
#endif
#if TRANSDUCE_AVX2
  if (!q.portable) return block_avx2(w, q, r0, r1, b0, b1, y, ldy);
#endif
  block_portable(w, q, r0, r1, b0, b1, y, ldy);
}

// y (M, N) = x (M, K) Wᵀ + b, row-major float buffers. portable: the plain loop even where VNNI is
// compiled in (tests). Threads split the output columns in 16-wide blocks; a small map stays on one.
inline void gemm(const float* x, int64_t M, const Weights& w, float* y, bool portable = false) {
  const Quantized q(x, M, w, portable);
  const int64_t grain = std::max<int64_t>(2, (1 << 16) / std::max<int64_t>(1, M * w.k4));
  at::parallel_for(0, w.n16 / 16, grain,
                   [&](int64_t b0, int64_t b1) { block(w, q, 0, M, b0, b1, y + b0 * 16, w.out); });
}

// x (..., K) -> (..., N) float.
inline at::Tensor linear(const at::Tensor& x, const Weights& w, bool portable = false) {
  TORCH_CHECK(x.size(-1) == w.in, "int8 linear: expected ", w.in, " input features, got ", x.size(-1));
  at::Tensor x2 = x.reshape({-1, w.in}).to(at::kFloat).contiguous();  // (M, K)
  auto sizes = x.sizes().vec();
  sizes.back() = w.out;
  at::Tensor y = at::empty({x2.size(0), w.out}, x2.options());  // (M, N)
  gemm(x2.data_ptr<float>(), x2.size(0), w, y.data_ptr<float>(), portable);
  return y.view(sizes);
}

}  // namespace int8
