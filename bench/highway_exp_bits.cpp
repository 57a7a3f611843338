// Google Highway's Exp over 2^22 points of [-87, 0], written as raw floats to the file named by argv[1]:
// bench/simd_libraries.py builds this for Highway's AVX2 target and for its scalar target and counts the
// results that differ (vecmath.h's exp returns the same bits at every level: tests/test_backends_cpu_paths.py).
#include <cstdio>
#include <vector>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

namespace hn = hwy::HWY_NAMESPACE;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const hn::ScalableTag<float> d;
  const int n = 1 << 22;  // a multiple of every vector width
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = -87.0f + 87.0f * float(i) / float(n - 1);
  for (int i = 0; i < n; i += int(hn::Lanes(d))) hn::StoreU(hn::Exp(d, hn::LoadU(d, x.data() + i)), d, y.data() + i);
  FILE* f = std::fopen(argv[1], "wb");
  if (f == nullptr || std::fwrite(y.data(), sizeof(float), y.size(), f) != y.size()) return 1;
  std::fclose(f);
  std::printf("%s\n", hwy::TargetName(HWY_STATIC_TARGET));
  return 0;
}
