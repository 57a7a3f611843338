// Inverted dropout (§5.4) in one pass, forward and backward: out = in · keep · scale.
//
// train/dropout.py's FastDropout builds its mask with three tensor ops (64-bit random_, a bitwise and, a
// compare) and applies it with two more, each a pass over the activation. Here the mask is a function of
// (seed, element index): word w = splitmix64(seed + w·φ) gives four 16-bit chunks, and element 4w + j is
// kept when the low 15 bits of chunk j are ≥ threshold (= round(p·32768)), FastDropout's distribution.
// Nothing is stored: the backward pass recomputes the same mask from the seed, so forward and backward are
// the same function. The seed comes from torch's CPU generator (dropout.py), so a checkpoint that saves the
// generator's state resumes the same masks.
// Compiled into native_train.cpp's extension on first use (transduce/train/native.py); without a compiler
// the tensor ops run.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "bf16.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

using at::Tensor;

namespace {

inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

using transduce::load;
using transduce::store;

// In chunks of 1,024 elements: first the chunk's 256 random words (a loop the compiler vectorises), then the
// elements, reading word w's chunk j as the 16-bit lane 4w + j (little-endian, as x86 and arm64 are).
template <typename T>
void apply(const T* in, T* out, int64_t n, uint64_t seed, uint32_t threshold, float scale) {
  constexpr int64_t kWords = 256;
  uint64_t words[kWords];
  uint16_t lanes[4 * kWords];
  for (int64_t start = 0; start < n; start += 4 * kWords) {
    const int64_t count = std::min<int64_t>(4 * kWords, n - start);
    const uint64_t first = static_cast<uint64_t>(start / 4);
    for (int64_t w = 0; w < kWords; ++w) words[w] = splitmix64(seed + (first + w) * 0x9E3779B97F4A7C15ull);
    std::memcpy(lanes, words, sizeof(lanes));
    const T* x = in + start;
    T* y = out + start;
    for (int64_t i = 0; i < count; ++i) {
      const float kept = (lanes[i] & 0x7FFFu) >= threshold ? scale : 0.0f;
      store(y, i, load(x, i) * kept);
    }
  }
}

// in: contiguous fp32 or bf16 on CPU. Returns a new tensor of in's shape and dtype.
Tensor dropout(const Tensor& in, int64_t seed, int64_t threshold, double scale) {
  TORCH_CHECK(in.device().is_cpu() && in.is_contiguous(), "native dropout: a contiguous CPU tensor, got ",
              in.device(), in.is_contiguous() ? "" : " (not contiguous)");
  TORCH_CHECK(threshold >= 0 && threshold <= 32768, "native dropout: threshold ", threshold, " outside [0, 32768]");
  Tensor out = at::empty_like(in);
  const int64_t n = in.numel();
  const auto s = static_cast<uint64_t>(seed);
  const auto t = static_cast<uint32_t>(threshold);
  if (in.scalar_type() == at::kFloat) {
    apply(in.data_ptr<float>(), out.data_ptr<float>(), n, s, t, static_cast<float>(scale));
  } else if (in.scalar_type() == at::kBFloat16) {
    apply(reinterpret_cast<const uint16_t*>(in.data_ptr<at::BFloat16>()),
          reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), n, s, t, static_cast<float>(scale));
  } else {
    TORCH_CHECK(false, "native dropout: fp32 or bf16, got ", in.scalar_type());
  }
  return out;
}

}  // namespace
