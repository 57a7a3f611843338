// The int8 step's element-wise functions (vecmath.h) against two maintained SIMD math libraries, at one
// SIMD level (the one this file is compiled for; bench/simd_libraries.py builds it for AVX2 + FMA):
//   exp:  vec::exp8  |  Google Highway's hwy::HWY_NAMESPACE::Exp  |  SLEEF's Sleef_expf8_u10avx2
//   GELU: vec::gelu8 |  x/2 · SLEEF's Sleef_erfcf8_u15avx2(-x/√2)  (Highway 1.0 has no erf)
// For each: nanoseconds per element over rows of the decoder's sizes (a target vocabulary of 8,000 for exp,
// d_ff = 2,048 for GELU; best of 25 passes of 200 rows), and the largest relative error against the float64
// function over a dense sweep of the inputs the step feeds them (exp: [-87, 0], after the max is subtracted;
// GELU: [-6, 6], where nearly all of a trained model's feed-forward inputs lie, and [-14, 14]); results under
// 1e-30 are left out of the error, their intermediates being subnormal. Prints one line of JSON per case.
#include <immintrin.h>
#include <sleef.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "vecmath.h"

namespace hn = hwy::HWY_NAMESPACE;
static_assert(HWY_STATIC_TARGET == HWY_AVX2, "Highway must build its AVX2 target (see the flags in simd_libraries.py)");

static void exp_vecmath(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, vec::exp8(_mm256_loadu_ps(x + i)));
}
static void exp_sleef(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, Sleef_expf8_u10avx2(_mm256_loadu_ps(x + i)));
}
static void exp_highway(const float* x, float* y, int n) {
  const hn::ScalableTag<float> d;
  for (int i = 0; i < n; i += int(hn::Lanes(d))) hn::StoreU(hn::Exp(d, hn::LoadU(d, x + i)), d, y + i);
}
static void gelu_vecmath(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, vec::gelu8(_mm256_loadu_ps(x + i)));
}
static void gelu_sleef(const float* x, float* y, int n) {
  const __m256 half = _mm256_set1_ps(0.5f), minus_rsqrt2 = _mm256_set1_ps(-0.70710678118654752f);
  for (int i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 q = Sleef_erfcf8_u15avx2(_mm256_mul_ps(v, minus_rsqrt2));  // erfc(-x/√2) = 2 Φ(x)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(half, v), q));
  }
}

using Fn = void (*)(const float*, float*, int);

static double ns_per_element(Fn f, int row, float lo, float hi) {
  const int rows = 200;
  std::vector<float> x(size_t(row) * rows), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = lo + (hi - lo) * float((i * 2654435761u) % 100003) / 100003.0f;
  double best = 1e30;
  for (int pass = 0; pass < 25; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rows; ++r) f(x.data() + size_t(r) * row, y.data() + size_t(r) * row, row);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  volatile float sink = y[y.size() / 2];
  (void)sink;
  return best * 1e9 / double(x.size());
}

struct Worst {
  double error = 0.0;
  float at = 0.0f;
};

static Worst max_rel_error(Fn f, double (*exact)(double), float lo, float hi, double floor) {
  const int n = 1 << 22;  // a multiple of 16
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = lo + (hi - lo) * float(i) / float(n - 1);
  f(x.data(), y.data(), n);
  Worst worst;
  for (int i = 0; i < n; ++i) {
    const double e = exact(double(x[i]));
    if (std::fabs(e) < floor) continue;  // deeper in the tail the intermediates are subnormal
    const double error = std::fabs(double(y[i]) - e) / std::fabs(e);
    if (error > worst.error) worst = {error, x[i]};
  }
  return worst;
}

static double exp_exact(double v) { return std::exp(v); }
static double gelu_exact(double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }

int main() {
  struct Case {
    const char* function;
    const char* implementation;
    Fn f;
    double (*exact)(double);
    int row;
    float lo, hi;
  };
  const Case cases[] = {
      {"exp", "vecmath", exp_vecmath, exp_exact, 8000, -87.0f, 0.0f},
      {"exp", "highway", exp_highway, exp_exact, 8000, -87.0f, 0.0f},
      {"exp", "sleef", exp_sleef, exp_exact, 8000, -87.0f, 0.0f},
      {"gelu", "vecmath", gelu_vecmath, gelu_exact, 2048, -6.0f, 6.0f},
      {"gelu", "sleef", gelu_sleef, gelu_exact, 2048, -6.0f, 6.0f},
      {"gelu", "vecmath", gelu_vecmath, gelu_exact, 2048, -14.0f, 14.0f},
      {"gelu", "sleef", gelu_sleef, gelu_exact, 2048, -14.0f, 14.0f},
  };
  for (const Case& c : cases) {
    const double ns = ns_per_element(c.f, c.row, c.lo, c.hi);
    const Worst err = max_rel_error(c.f, c.exact, c.lo, c.hi, 1e-30);
    std::printf("{\"function\": \"%s\", \"implementation\": \"%s\", \"row\": %d, \"ns_per_element\": %.4f, "
                "\"range\": [%g, %g], \"max_rel_error\": %.3e, \"worst_at\": %.7g}\n",
                c.function, c.implementation, c.row, ns, double(c.lo), double(c.hi), err.error, double(err.at));
  }
  return 0;
}
