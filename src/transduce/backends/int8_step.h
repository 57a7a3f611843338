// The loop step's non-GEMM work as plain loops over float buffers (paper §3.1, §3.2): the int8 step
// (int8_gemm.h's maps) and the fp32 step (fp32_gemm.h's maps) share them.
//
// At batch 1 (beam 4: 4 rows) each ATen op of a step costs ~1-3 µs of dispatch and allocation for well
// under a µs of arithmetic, and the step had ~40 of them per layer. These loops compute the same functions
// (attention over the key cache, residual + layer norm, embedding) in fp32 with their own summation order,
// the same on every SIMD level (vecmath.h). The bf16 C++ step keeps the ATen ops (and Python's exact
// outputs); so does the fp32 one when asked for exactness (native.py: maps="aten").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>

#include "fp32_gemm.h"
#include "int8_gemm.h"
#include "vecmath.h"

namespace int8 {

// f(n) for n in [0, N), split over ATen's threads when the rows carry enough work (`work` floats each).
template <typename F>
inline void rows(int64_t N, int64_t work, const F& f) {
  at::parallel_for(0, N, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, work)), [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) f(n);
  });
}

// The loops' fp32 math (vecmath.h): vectorised where the CPU allows, one row at a time, the same bits on
// every SIMD level.
using vec::dot;
using vec::logsumexp;
using vec::sum;
using vec::sum_squares;

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

// y (M, d) = W2 act(W1 x + b1) + b2 (§3.3); hidden (M, d_ff) is scratch. W: int8::Weights or f32::Weights
// (the gemm of its namespace).
template <typename W>
inline void feed_forward(const float* x, int64_t M, const W& w1, const W& w2, float* hidden, float* y,
                         Activation act) {
  gemm(x, M, w1, hidden);
  const int64_t n = M * w1.out;
  switch (act) {
    case Activation::gelu:  // x Φ(x)
      vec::gelu(hidden, n);
      break;
    case Activation::swish:  // x σ(x)
      vec::swish(hidden, n);
      break;
    case Activation::relu:
      for (int64_t i = 0; i < n; ++i) hidden[i] = std::max(hidden[i], 0.0f);
      break;
  }
  gemm(hidden, M, w2, y);
}

// out (d_k) = softmax(scale · q Kᵀ) V over the T keys at k, v (T, d_k each, rows ks and vs floats apart);
// visible (T) or null: only those keys. No visible key: zeros (as attention_reference). The hidden keys are
// dropped before the softmax (scores, keep: T each, scratch), so its sums run over the visible keys alone, in
// order: a sentence's output does not depend on how much padding its batch gives it.
inline void attend_one(const float* q, const float* k, const float* v, int64_t T, int64_t ks, int64_t vs,
                       int64_t d_k, float scale, const bool* visible, float* scores, int64_t* keep, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  int64_t c = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (visible != nullptr && !visible[t]) continue;
    keep[c] = t;
    top = std::max(top, scores[c++] = dot(q, k + t * ks, d_k) * scale);
  }
  std::fill(out, out + d_k, 0.0f);
  if (c == 0) return;
  const float inv = 1.0f / vec::exp_shifted(scores, c, top);
  for (int64_t j = 0; j < c; ++j) {
    const float p = scores[j] * inv;
    const float* vt = v + keep[j] * vs;
    for (int64_t i = 0; i < d_k; ++i) out[i] += p * vt[i];
  }
}

// Scratch for attend_one's T scores and kept keys, one per thread.
struct AttendScratch {
  std::vector<float> scores;
  std::vector<int64_t> keep;
  void fit(int64_t T) { scores.resize(T), keep.resize(T); }
};

// Masked self-attention of one new position per row (§3.2.3) with the key/value cache.
// qkv (N, 3, h, d_k): this step's projections; old_k/old_v (N', h, t, d_k) or null (first step);
// kept (N) or null: which old row each row continues (a pending beam reorder); new_k/new_v (N, h, t+1, d_k)
// receive the kept cache and this position; out (N, h·d_k).
inline void self_attention(const float* qkv, const float* old_k, const float* old_v, const int64_t* kept,
                           int64_t N, int64_t h, int64_t t, int64_t d_k, float scale, float* new_k,
                           float* new_v, float* out) {
  const int64_t d = h * d_k, T = t + 1;
  rows(N, h * T * d_k, [&](int64_t n) {
    thread_local AttendScratch scratch;
    scratch.fit(T);
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
      attend_one(q, kc, vc, T, d_k, d_k, d_k, scale, nullptr, scratch.scores.data(), scratch.keep.data(),
                 out + n * d + j * d_k);
    }
  });
}

// The self-attention keys and values of every step so far (§3.2.3's cache), kept where each step wrote
// them: per step and layer, keys and values (N_τ, h·d_k) for that step's N_τ rows, and `from` (N, t): which
// row of step τ each current row continues. A beam reorder then rewrites N·t indices, where a cache of
// (N, h, t, d_k) tensors copies N·t·d floats for every layer's keys and values.
struct History {
  int64_t layers, d, t = 0, n = 0;  // t: steps so far; n: the rows of the last one
  std::vector<std::vector<float>> keys, values;  // [τ · layers + l]: (N_τ, d)
  std::vector<int32_t> from;  // (n, t)

  History(int64_t layers, int64_t d) : layers(layers), d(d) {}

  // Start a step of N rows, row i continuing row kept[i] of the last step (kept null: row i, N = n); the
  // step's keys and values are written by the caller into key(t - 1, l) and value(t - 1, l).
  void advance(int64_t N, const int64_t* kept) {
    std::vector<int32_t> next(N * (t + 1));
    for (int64_t i = 0; i < N; ++i) {
      const int64_t src = kept != nullptr ? kept[i] : i;
      TORCH_CHECK(t == 0 || (src >= 0 && src < n), "beam reorder: row ", src, " of ", n);
      if (t > 0) std::copy(from.begin() + src * t, from.begin() + (src + 1) * t, next.begin() + i * (t + 1));
      next[i * (t + 1) + t] = static_cast<int32_t>(i);
    }
    from.swap(next);
    for (int64_t l = 0; l < layers; ++l) keys.emplace_back(N * d), values.emplace_back(N * d);
    ++t, n = N;
  }

  float* key(int64_t step, int64_t l) { return keys[step * layers + l].data(); }
  float* value(int64_t step, int64_t l) { return values[step * layers + l].data(); }
};

// Masked self-attention of one new position per row (§3.2.3) over layer l of a History whose last step
// (advance) is this one: qkv (N, 3, h, d_k): this step's projections, whose keys and values are stored into
// it; out (N, h·d_k). The same arithmetic as self_attention.
inline void self_attention(const float* qkv, History& hist, int64_t l, int64_t h, int64_t d_k, float scale,
                           float* out) {
  const int64_t N = hist.n, T = hist.t, d = h * d_k;
  float* k_now = hist.key(T - 1, l);
  float* v_now = hist.value(T - 1, l);
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(k_now + n * d, qkv + n * 3 * d + d, d * sizeof(float));
    std::memcpy(v_now + n * d, qkv + n * 3 * d + 2 * d, d * sizeof(float));
  }
  rows(N, h * T * d_k, [&](int64_t n) {
    thread_local std::vector<float> scores;
    thread_local std::vector<const float*> ks, vs;
    scores.resize(T), ks.resize(T), vs.resize(T);
    for (int64_t tau = 0; tau < T; ++tau) {  // this row's ancestor at each step
      const int64_t r = hist.from[n * T + tau];
      ks[tau] = hist.key(tau, l) + r * d, vs[tau] = hist.value(tau, l) + r * d;
    }
    for (int64_t j = 0; j < h; ++j) {
      const float* q = qkv + n * 3 * d + j * d_k;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t tau = 0; tau < T; ++tau) top = std::max(top, scores[tau] = dot(q, ks[tau] + j * d_k, d_k) * scale);
      const float inv = 1.0f / vec::exp_shifted(scores.data(), T, top);
      float* o = out + n * d + j * d_k;
      std::fill(o, o + d_k, 0.0f);
      for (int64_t tau = 0; tau < T; ++tau) {
        const float p = scores[tau] * inv;
        const float* vt = vs[tau] + j * d_k;
        for (int64_t i = 0; i < d_k; ++i) o[i] += p * vt[i];
      }
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
    thread_local AttendScratch scratch;
    scratch.fit(S);
    const int64_t b = n / beam;
    for (int64_t j = 0; j < h; ++j) {
      attend_one(q + n * d + j * d_k, mem_k + b * ks[0] + j * ks[1], mem_v + b * vs[0] + j * vs[1], S, ks[2], vs[2],
                 d_k, scale, visible != nullptr ? visible + b * S : nullptr, scratch.scores.data(),
                 scratch.keep.data(), out + n * d + j * d_k);
    }
  });
}


// The k largest entries of a row, best first, into val/idx (k each): a sorted list that a row's pieces are
// offered to in order; a piece's entries that do not beat the k-th are skipped, 16 at a time where the CPU
// has AVX2 or AVX-512. Among equal values the first keeps its place.
struct TopK {
  float* val;
  int64_t* idx;
  int64_t k, have = 0;

  TopK(float* val, int64_t* idx, int64_t k) : val(val), idx(idx), k(k) {}

  void offer(float v, int64_t i) {
    if (have == k && !(v > val[k - 1])) return;
    int64_t p = have < k ? have++ : k - 1;
    while (p > 0 && v > val[p - 1]) val[p] = val[p - 1], idx[p] = idx[p - 1], --p;
    val[p] = v, idx[p] = i;
  }

  // x (n floats): the row's entries base, base + 1, ...
  void scan(const float* x, int64_t n, int64_t base) {
    int64_t i = 0;
    for (; i < n && have < k; ++i) offer(x[i], base + i);
    while ((i = vec::next_above(x, i, n, val[k - 1])) < n) offer(x[i], base + i), ++i;
  }
};

// The k largest of x (n floats), best first, into val/idx (k each, k <= n).
inline void row_topk(const float* x, int64_t n, int64_t k, float* val, int64_t* idx) {
  TopK(val, idx, k).scan(x, n, 0);
}

// What beam search needs of each row's next-token distribution (§6.1): z = log Σ exp(logits), the eos
// logit, and the k largest logits with their tokens (val/tok (N, k)). log p = logit - z.
struct RowBest {
  int64_t k;
  std::vector<float> z, eos_logit, val;
  std::vector<int64_t> tok;
  RowBest(int64_t N, int64_t k, int64_t eos)
      : k(k), z(N), eos_logit(N), val(N * k, -std::numeric_limits<float>::infinity()), tok(N * k, eos) {}
};

// RowBest of logits (N, V) given as floats: each row read whole.
inline RowBest best_of_logits(const float* x, int64_t N, int64_t V, int64_t k, int64_t eos) {
  RowBest best(N, k, eos);
  rows(N, V, [&](int64_t n) {
    best.z[n] = logsumexp(x + n * V, V);
    best.eos_logit[n] = x[n * V + eos];
    row_topk(x + n * V, V, k, best.val.data() + n * k, best.tok.data() + n * k);
  });
  return best;
}

// RowBest of the pre-softmax projection x (N, d) Wᵀ + b (V outputs in `blocks` 16-wide blocks) without
// writing the (N, V) logits: `block(r0, r1, b0, b1, y, ldy)` makes them CHUNK columns (L1-sized) at a time
// for ROWS rows, and each piece goes at once into its row's running log Σ exp and top k. Threads split the
// rows; each row is computed on its own, as in the GEMMs.
template <typename Block>
inline RowBest best_of_blocks(int64_t N, int64_t V, int64_t blocks, int64_t k, int64_t eos, const Block& block) {
  constexpr int64_t CHUNK = 256, BLOCKS = CHUNK / 16, ROWS = 6;  // ROWS: whole tiles of 3 (AVX2) or 2 + 4 (VNNI)
  RowBest best(N, k, eos);
  const int64_t groups = (N + ROWS - 1) / ROWS;
  at::parallel_for(0, groups, 1, [&](int64_t a, int64_t b) {
    const int64_t r0 = a * ROWS, r1 = std::min(N, b * ROWS);
    std::vector<vec::LogSumExp> lse(r1 - r0);
    std::vector<TopK> top;
    for (int64_t r = r0; r < r1; ++r) top.emplace_back(best.val.data() + r * k, best.tok.data() + r * k, k);
    std::vector<float> piece(ROWS * CHUNK);  // (ROWS, CHUNK)
    for (int64_t c0 = 0; c0 < V; c0 += CHUNK) {
      const int64_t width = std::min(CHUNK, V - c0), b0 = c0 / 16;
      for (int64_t r = r0; r < r1; r += ROWS) {
        const int64_t rn = std::min<int64_t>(ROWS, r1 - r);
        block(r, r + rn, b0, std::min(b0 + BLOCKS, blocks), piece.data(), CHUNK);
        for (int64_t i = 0; i < rn; ++i) {
          const float* p = piece.data() + i * CHUNK;
          lse[r + i - r0].add(p, width);
          top[r + i - r0].scan(p, width, c0);
          if (eos >= c0 && eos < c0 + width) best.eos_logit[r + i] = p[eos - c0];
        }
      }
    }
    for (int64_t r = r0; r < r1; ++r) best.z[r] = lse[r - r0].value();
  });
  return best;
}

// best_of_blocks with an int8 map: x quantised once for every block.
inline RowBest best_of_projection(const float* x, int64_t N, const Weights& w, int64_t k, int64_t eos) {
  const Quantized q(x, N, w);
  return best_of_blocks(N, w.out, w.n16 / 16, k, eos, [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1, float* y,
                                                          int64_t ldy) { block(w, q, r0, r1, b0, b1, y, ldy); });
}

// best_of_blocks with an fp32 map.
inline RowBest best_of_projection(const float* x, int64_t N, const f32::Weights& w, int64_t k, int64_t eos) {
  return best_of_blocks(N, w.out, w.n16 / 16, k, eos, [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1, float* y,
                                                          int64_t ldy) { f32::block(w, x, r0, r1, b0, b1, y, ldy); });
}

}  // namespace int8
