// vecmath.h's functions on the inputs in a file, their results written to another, as raw float32:
// the same program built for this CPU and for another (aarch64, run under qemu-user) must write the same
// bytes (tests/test_backends_cpu_paths.py). No torch: the decoder step's own code, nothing else.
//
//   vecmath_probe IN OUT    IN: n float32 values x; OUT: exp(x), gelu(x), swish(x) (n each), then for each
//                           length L of kLengths (L <= n): sum, sum_squares(c = 0.5), dot(x, x), max,
//                           logsumexp of x[0:L], and logsumexp of x[0:L] with its first L/2 set to -inf.
#include <cstdio>
#include <vector>

#include "vecmath.h"

static const int64_t kLengths[] = {1, 7, 15, 16, 17, 31, 32, 33, 300, 8000};

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) {
    std::perror(argv[1]);
    return 1;
  }
  std::vector<float> x;
  float v;
  while (std::fread(&v, sizeof v, 1, in) == 1) x.push_back(v);
  std::fclose(in);
  const int64_t n = static_cast<int64_t>(x.size());

  std::vector<float> out;
  for (int f = 0; f < 3; ++f) {
    std::vector<float> y = x;
    if (f == 0) vec::exp_shifted(y.data(), n, 0.0f);
    if (f == 1) vec::gelu(y.data(), n);
    if (f == 2) vec::swish(y.data(), n);
    out.insert(out.end(), y.begin(), y.end());
  }
  for (int64_t L : kLengths) {
    if (L > n) continue;
    std::vector<float> masked(x.begin(), x.begin() + L);
    for (int64_t i = 0; i < L / 2; ++i) masked[i] = vec::NEG_INF;
    out.push_back(vec::sum(x.data(), L));
    out.push_back(vec::sum_squares(x.data(), 0.5f, L));
    out.push_back(vec::dot(x.data(), x.data(), L));
    out.push_back(vec::max(x.data(), L));
    out.push_back(vec::logsumexp(x.data(), L));
    out.push_back(vec::logsumexp(masked.data(), L));
  }

  std::FILE* o = std::fopen(argv[2], "wb");
  if (!o || std::fwrite(out.data(), sizeof(float), out.size(), o) != out.size() || std::fclose(o) != 0) {
    std::perror(argv[2]);
    return 1;
  }
  return 0;
}
