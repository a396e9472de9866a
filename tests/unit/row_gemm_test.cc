#include "kernels/row_gemm.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tandem::kernels {
namespace {

// Every path of RowGemmF32 that this CPU runs (the portable loop always,
// AVX2 and AVX-512 where present; RowGemmF32 itself, whichever it picks)
// against a double-precision loop, on shapes that exercise every edge of
// the tilings: rows of x not multiples of 4 or 3 (AVX2's short tiles of 1,
// 2 and 3 rows; its 2 x 6 tiles for one or two rows), rows of w not
// multiples of 3, 4 or 6 (a repeated last row), k
// not a multiple of 8 or 16 (the masked tails) or shorter than 8, column
// ranges that start and end inside a group of w rows, and the scalar
// path's shapes alike.
TEST_CASE("RowGemmF32 equals the product at every tile edge", "[row_gemm]") {
  // 0-2: the paths; 3: RowGemmF32; 4 on: the AVX2 path with each tile
  // shape of row_gemm_bench's sweep (RowGemmAvx2TileShapes).
  const std::vector<Avx2Tile>& tiles = RowGemmAvx2TileShapes();
  const int which = GENERATE(range(0, 11));
  REQUIRE(tiles.size() == 7);
  const RowGemmPath paths[] = {RowGemmPath::kPortable, RowGemmPath::kAvx2,
                               RowGemmPath::kAvx512};
  if ((which < 3 && !RowGemmF32Supports(paths[which])) ||
      (which >= 4 && !RowGemmF32Supports(RowGemmPath::kAvx2))) {
    SUCCEED("path " << which << " not supported by this CPU");
    return;
  }
  const auto gemm = [&](const float* x, const float* w, float* y, int64_t m,
                        int64_t n, int64_t k, int64_t begin, int64_t end) {
    if (which >= 4) {
      REQUIRE(RowGemmF32Avx2Tile(tiles[which - 4], x, w, y, m, n, k, begin,
                                 end));
    } else if (which == 3) {
      RowGemmF32(x, w, y, m, n, k, begin, end);
    } else {
      RowGemmF32On(paths[which], x, w, y, m, n, k, begin, end);
    }
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  INFO("path " << which << " (0 portable, 1 AVX2, 2 AVX-512, 3 RowGemmF32"
               << " = " << static_cast<int>(RowGemmF32Path())
               << ", 4-10 AVX2 tiles)");
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s :
       {Shape{1, 1, 1}, Shape{2, 5, 16}, Shape{3, 7, 13}, Shape{4, 8, 32},
        Shape{5, 9, 37}, Shape{6, 10, 7}, Shape{7, 11, 24}, Shape{8, 12, 9},
        Shape{32, 128, 896}, Shape{33, 66, 100}, Shape{34, 13, 15},
        Shape{35, 14, 17}, Shape{1, 23, 8}, Shape{2, 20, 19},
        Shape{2, 6, 896}, Shape{5, 7, 27}}) {
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

TEST_CASE("RowGemmF32Avx2Tile refuses a shape it does not have",
          "[row_gemm]") {
  float x = 1, w = 1, y = 0;
  CHECK_FALSE(RowGemmF32Avx2Tile({5, 5}, &x, &w, &y, 1, 1, 1, 0, 1));
  CHECK(y == 0);
}

// RowGemmF32 runs the fastest path the CPU supports: AVX-512, then AVX2,
// then the portable loop (an AVX2-only CPU once fell to the loop).
TEST_CASE("RowGemmF32 takes the fastest path this CPU supports",
          "[row_gemm]") {
  REQUIRE(RowGemmF32Supports(RowGemmPath::kPortable));
  const RowGemmPath want =
      RowGemmF32Supports(RowGemmPath::kAvx512) ? RowGemmPath::kAvx512
      : RowGemmF32Supports(RowGemmPath::kAvx2) ? RowGemmPath::kAvx2
                                               : RowGemmPath::kPortable;
  CHECK(RowGemmF32Path() == want);
  CHECK(RowGemmF32Fast() == (want != RowGemmPath::kPortable));
}

// The column split that the model and row_gemm_bench share: consecutive
// ranges of whole groups of 4, covering [0, n) once, at least 16 groups a
// range, never more ranges than asked for, at least one.
TEST_CASE("RowGemmParts and RowGemmColumns split the columns exactly once",
          "[row_gemm]") {
  CHECK(RowGemmParts(0, 4) == 1);
  CHECK(RowGemmParts(124, 4) == 1);  // 31 groups: too few for two ranges
  CHECK(RowGemmParts(128, 4) == 2);
  CHECK(RowGemmParts(4864, 2) == 2);
  CHECK(RowGemmParts(4864, 64) == 64);
  CHECK(RowGemmParts(4864, 100) == 76);  // 1216 groups / 16
  CHECK(RowGemmParts(151936, 1) == 1);
  for (int64_t n : {1, 3, 4, 63, 64, 65, 127, 128, 129, 896, 4864, 151936}) {
    for (int64_t max_parts : {1, 2, 3, 7}) {
      const int64_t parts = RowGemmParts(n, max_parts);
      INFO("n " << n << " max_parts " << max_parts << " parts " << parts);
      REQUIRE(parts >= 1);
      REQUIRE(parts <= max_parts);
      int64_t next = 0;
      for (int64_t part = 0; part < parts; ++part) {
        const ColumnRange c = RowGemmColumns(n, parts, part);
        REQUIRE(c.begin == next);
        REQUIRE(c.end >= c.begin);
        if (part + 1 < parts) REQUIRE(c.end % 4 == 0);
        if (parts > 1) REQUIRE((c.end - c.begin + 3) / 4 >= 16);
        next = c.end;
      }
      REQUIRE(next == n);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
