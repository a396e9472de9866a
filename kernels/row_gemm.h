#pragma once

// Y = X W^T for a few rows of X against a large row-major weight W, the
// shape of a decode step's projections (X: one row per sequence). MKL's
// sgemm copies (packs) W into its own layout on every call; this kernel
// streams W as stored instead: each group of a few rows of W is read once
// from memory and multiplied, from L1, with every row of X (which stays in
// L2), in tiles of vector accumulators:
//  * AVX-512F: 4 rows of X x 4 rows of W, 16 lanes. On 2 cores it computed
//    a batch-32 decode step's products (Qwen2.5-0.5B shapes) 1.7x faster
//    than MKL with W on the left and 2.6x faster than at::linear (issue 20,
//    docs/benchmarks.md).
//  * AVX2 + FMA (16 registers): 4 rows of X x 3 rows of W, 8 lanes (12
//    accumulators + 3 registers of W + 1 of X), the k loop unrolled twice;
//    for 1-2 rows of X, 2 x 6. On an AVX2-only EPYC (one decode step's
//    products at Qwen2.5-0.5B shapes, one thread, thread CPU time, two
//    runs) 4 x 3, 3 x 4 and 2 x 6 were within 8 % of each other at 8 and
//    32 rows, 3 x 3, 2 x 4, 4 x 2 and 6 x 2 10-35 % slower than the best;
//    2 x 6 was the fastest at 2 rows (4-11 %). Of the three, 4 x 3 needs
//    the fewest loads per FMA (7 per 12).
//    Against MKL on that CPU (tests/bench/row_gemm_bench.cc, quiet
//    machine): one thread 1.3x faster than W on the left at 32 rows, 2.1x
//    at 8, 1.9x at 2, 1.3x at::linear at one row; two threads 1.2-1.9x
//    at 8-48 rows.
//  * Elsewhere a plain loop (slow: callers should prefer their BLAS).
//
// The caller splits the columns [0, n) of Y into ranges, one per thread
// (RowGemmF32 handles one range; RowGemmParts and RowGemmColumns say how),
// so that this library stays free of any thread pool. Thread-safe, no
// allocation.

#include <cstdint>
#include <vector>

namespace tandem::kernels {

// The code paths of RowGemmF32, fastest first.
enum class RowGemmPath {
  kAvx512,    // AVX-512F + FMA: 4 x 4 tiles of 16 lanes
  kAvx2,      // AVX2 + FMA: 4 x 3 (or 2 x 6) tiles of 8 lanes
  kPortable,  // a plain loop, any CPU
};

// Whether this CPU can run `path`.
bool RowGemmF32Supports(RowGemmPath path);

// The path RowGemmF32 takes on this CPU: the first of kAvx512, kAvx2,
// kPortable that it supports (checked once).
RowGemmPath RowGemmF32Path();

// Whether RowGemmF32 has a vector path on this CPU (RowGemmF32Path() is not
// kPortable). Without one RowGemmF32 still computes the product, slowly (a
// scalar loop): callers should prefer their BLAS then.
bool RowGemmF32Fast();

// How many column ranges a product with n columns is worth splitting into
// on at most max_parts threads: ranges of whole groups of 4 rows of W, at
// least 16 groups (64 x k_dim values) each, so that a thread's share pays
// for waking it. At least 1.
int64_t RowGemmParts(int64_t n, int64_t max_parts);

// The columns [begin, end) of range `part` of `parts` (REQUIRES: 0 <= part <
// parts): consecutive, whole groups of 4 (the last may end at n), covering
// [0, n) exactly once over all parts.
struct ColumnRange {
  int64_t begin = 0;
  int64_t end = 0;
};
ColumnRange RowGemmColumns(int64_t n, int64_t parts, int64_t part);

// y[i * n + j] = sum_k x[i * k_dim + k] * w[j * k_dim + k] for i in [0, m)
// and j in [n_begin, n_end): x [m, k_dim], w [n, k_dim] and y [m, n], all
// row-major and dense. Sums in float32 in a blocked order (8 or 16 lanes,
// then a tree): equal to a BLAS product up to float32 rounding. Runs
// RowGemmF32Path().
void RowGemmF32(const float* x, const float* w, float* y, int64_t m, int64_t n,
                int64_t k_dim, int64_t n_begin, int64_t n_end);

// The same product by the given path, so that a test can check every path
// this CPU runs. REQUIRES: RowGemmF32Supports(path).
void RowGemmF32On(RowGemmPath path, const float* x, const float* w, float* y,
                  int64_t m, int64_t n, int64_t k_dim, int64_t n_begin,
                  int64_t n_end);

// The AVX2 path's tile shapes, for the tile sweep of row_gemm_bench
// (--tiles) and its test: rows of x by rows of w per tile, 8 to 12
// accumulators each. RowGemmF32 itself takes 4 x 3 (2 x 6 for 1-2 rows).
struct Avx2Tile {
  int x_rows = 0;
  int w_rows = 0;
};
const std::vector<Avx2Tile>& RowGemmAvx2TileShapes();

// RowGemmF32's product by the AVX2 path with every tile of the given shape
// (the short tiles at the edges as RowGemmF32's). False, computing nothing,
// when the CPU has no AVX2 + FMA or the shape is not one of
// RowGemmAvx2TileShapes().
bool RowGemmF32Avx2Tile(Avx2Tile tile, const float* x, const float* w,
                        float* y, int64_t m, int64_t n, int64_t k_dim,
                        int64_t n_begin, int64_t n_end);

}  // namespace tandem::kernels
