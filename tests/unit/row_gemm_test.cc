#include "kernels/row_gemm.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tandem::kernels {
namespace {

// RowGemmF32 against a double-precision loop, on shapes that exercise every
// edge of its tiling: rows of x and of w not multiples of 4, k not a
// multiple of 16 (the masked tail) or shorter than 16, column ranges that
// start and end inside a group of 4, and the scalar path's shapes alike.
// The portable loop is checked the same way (on a CPU with AVX-512F
// RowGemmF32 never runs it).
TEST_CASE("RowGemmF32 equals the product at every tile edge", "[row_gemm]") {
  using Gemm = void (*)(const float*, const float*, float*, int64_t, int64_t,
                        int64_t, int64_t, int64_t);
  const bool portable = GENERATE(false, true);
  const Gemm gemm = portable ? &RowGemmF32Portable : &RowGemmF32;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  INFO("portable loop: " << portable << ", vector path: " << RowGemmF32Fast());
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s :
       {Shape{1, 1, 1}, Shape{2, 5, 16}, Shape{3, 7, 13}, Shape{4, 8, 32},
        Shape{5, 9, 37}, Shape{32, 128, 896}, Shape{33, 66, 100}}) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    std::vector<float> x(s.m * s.k), w(s.n * s.k);
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = normal(rng);
    // Columns in uneven ranges, as threads would split them; a sentinel
    // shows that nothing outside [0, n) is written.
    std::vector<float> y(s.m * s.n, -12345.0f);
    const int64_t cut1 = s.n / 3, cut2 = (2 * s.n) / 3 + 1;
    gemm(x.data(), w.data(), y.data(), s.m, s.n, s.k, 0, cut1);
    gemm(x.data(), w.data(), y.data(), s.m, s.n, s.k, cut1,
               std::min(cut2, s.n));
    gemm(x.data(), w.data(), y.data(), s.m, s.n, s.k, std::min(cut2, s.n),
               s.n);
    double worst = 0;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double want = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          want += static_cast<double>(x[i * s.k + k]) * w[j * s.k + k];
        }
        worst = std::max(worst, std::abs(want - y[i * s.n + j]));
      }
    }
    // float32 sums of k products of N(0,1) values: error ~ sqrt(k) * 1e-7.
    CHECK(worst < 1e-4 * std::sqrt(static_cast<double>(s.k)) + 1e-5);
  }
}

}  // namespace
}  // namespace tandem::kernels
