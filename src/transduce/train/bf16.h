// bf16 <-> fp32 for the C++ training kernels (native_loss.cpp, native_dropout.cpp): bf16 is held as the
// top 16 bits of an fp32, so widening is exact and narrowing rounds to nearest even, as torch does.
#pragma once

#include <cstdint>
#include <cstring>

namespace transduce {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) {
  uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  p[i] = static_cast<uint16_t>(bits >> 16);
}

}  // namespace transduce
