// y = x Wᵀ + b in fp32 for the loop step's few rows (int8_step.h with fp32 maps: the fp32-native backend).
//
// Why not ATen's GEMM (MKL, oneDNN)? Its call costs a few µs of dispatch at 4 rows, and its bits depend on
// the CPU and the thread count (another kernel, another summation order). Here every output is one chain of
// fused multiply-adds in input order, y[r, o] = fma(x[r, K-1], w[o, K-1], ... fma(x[r, 0], w[o, 0], 0)) + b[o],
// whatever the instruction set (AVX-512, AVX2 + FMA, the portable loop with std::fma) and the threads: the
// same bits everywhere, and a row's output does not depend on the other rows (batch-invariant).
//
// Layout: W is packed once as (N/16, K, 16): for 16 outputs, the 16 weights of input k are one 64-byte
// vector. A tile of R rows keeps R·16 running sums in registers, loads each weight vector once for its R
// rows and broadcasts x[r, k]: the vector lanes are 16 independent outputs, never a split of one sum.
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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace f32 {

// A linear map's fp32 weights, packed once.
struct Weights {
  int64_t in = 0, out = 0, n16 = 0;  // K, N, N rounded up to 16
  std::vector<float> packed;         // (n16/16, K, 16), zeros past N
  std::vector<float> bias;           // (n16,) zeros where the map has none

  // w (N, K) float, bias (N,) or undefined.
  Weights(const at::Tensor& w, const at::Tensor& b) {
    at::Tensor w32 = w.detach().to(at::kFloat).contiguous();
    out = w32.size(0), in = w32.size(1), n16 = (out + 15) / 16 * 16;
    packed.assign(n16 * in, 0.0f), bias.assign(n16, 0.0f);
    const float* W = w32.data_ptr<float>();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) packed[((o / 16) * in + k) * 16 + o % 16] = W[o * in + k];
    if (b.defined()) {
      at::Tensor b32 = b.detach().to(at::kFloat).contiguous();
      std::copy(b32.data_ptr<float>(), b32.data_ptr<float>() + out, bias.begin());
    }
  }
};

// R rows (R <= 4) of x (rows w.in floats apart) by the 16 outputs of block nb into y (rows ldy apart);
// columns past w.out are not written.
template <int R>
inline void tile(const Weights& w, const float* x, float* y, int64_t ldy, int64_t nb) {
  const int64_t K = w.in, o = nb * 16, live = std::min<int64_t>(16, w.out - o);
  const float* panel = w.packed.data() + nb * K * 16;
  alignas(64) float v[R][16];
#if defined(__AVX512F__)
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 wk = _mm512_loadu_ps(panel + k * 16);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * K + k]), wk, acc[r]);
  }
  const __m512 b = _mm512_loadu_ps(w.bias.data() + o);
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(v[r], _mm512_add_ps(acc[r], b));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(panel + k * 16), w1 = _mm256_loadu_ps(panel + k * 16 + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 xr = _mm256_set1_ps(x[r * K + k]);
      acc[r][0] = _mm256_fmadd_ps(xr, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xr, w1, acc[r][1]);
    }
  }
  const __m256 b0 = _mm256_loadu_ps(w.bias.data() + o), b1 = _mm256_loadu_ps(w.bias.data() + o + 8);
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(v[r], _mm256_add_ps(acc[r][0], b0));
    _mm256_store_ps(v[r] + 8, _mm256_add_ps(acc[r][1], b1));
  }
#else
  for (int r = 0; r < R; ++r) std::fill(v[r], v[r] + 16, 0.0f);
  for (int64_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 16; ++j) v[r][j] = std::fma(x[r * K + k], panel[k * 16 + j], v[r][j]);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 16; ++j) v[r][j] += w.bias[o + j];
#endif
  for (int r = 0; r < R; ++r) std::memcpy(y + r * ldy, v[r], live * sizeof(float));
}

// Rows [r0, r1) of x (M, K) by 16-wide column blocks [b0, b1) of x Wᵀ + b into y (at row r0, column b0 · 16;
// rows ldy apart). Block by block: a block's weights stay in cache for every row.
inline void block(const Weights& w, const float* x, int64_t r0, int64_t r1, int64_t b0, int64_t b1, float* y,
                  int64_t ldy) {
  const int64_t K = w.in;
  for (int64_t nb = b0; nb < b1; ++nb) {
    float* yb = y + (nb - b0) * 16;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) tile<4>(w, x + r * K, yb + (r - r0) * ldy, ldy, nb);
    switch (r1 - r) {
      case 3: tile<3>(w, x + r * K, yb + (r - r0) * ldy, ldy, nb); break;
      case 2: tile<2>(w, x + r * K, yb + (r - r0) * ldy, ldy, nb); break;
      case 1: tile<1>(w, x + r * K, yb + (r - r0) * ldy, ldy, nb); break;
      default: break;
    }
  }
}

// y (M, N) = x (M, K) Wᵀ + b, row-major float buffers. Threads split the output columns in 16-wide blocks
// (each output is computed whole by one thread, so the bits do not depend on the threads).
inline void gemm(const float* x, int64_t M, const Weights& w, float* y) {
  const int64_t grain = std::max<int64_t>(2, (1 << 14) / std::max<int64_t>(1, M * w.in));
  at::parallel_for(0, w.n16 / 16, grain, [&](int64_t b0, int64_t b1) { block(w, x, 0, M, b0, b1, y + b0 * 16, w.out); });
}

}  // namespace f32
