#pragma once

// Y = X W^T for a few rows of X against a large row-major weight W, the
// shape of a decode step's projections (X: one row per sequence). MKL's
// sgemm copies (packs) W into its own layout on every call; this kernel
// streams W as stored instead: each group of 4 rows of W is read once from
// memory and multiplied, from L1, with every row of X (which stays in L2),
// in 4 x 4 tiles of AVX-512 accumulators. On 2 cores it computed a batch-32
// decode step's products (Qwen2.5-0.5B shapes) 1.7x faster than MKL with W
// on the left and 2.6x faster than at::linear (issue 20, docs/benchmarks.md).
//
// The caller splits the columns [0, n) of Y into ranges, one per thread
// (RowGemmF32 handles one range), so that this library stays free of any
// thread pool. Thread-safe, no allocation.

#include <cstdint>

namespace tandem::kernels {

// Whether RowGemmF32 has a vector path on this CPU (AVX-512F; checked
// once). Without it RowGemmF32 still computes the product, slowly (a
// scalar loop): callers should prefer their BLAS then.
bool RowGemmF32Fast();

// y[i * n + j] = sum_k x[i * k_dim + k] * w[j * k_dim + k] for i in [0, m)
// and j in [n_begin, n_end): x [m, k_dim], w [n, k_dim] and y [m, n], all
// row-major and dense. Sums in float32 in a blocked order (16 lanes, then a
// tree): equal to a BLAS product up to float32 rounding.
void RowGemmF32(const float* x, const float* w, float* y, int64_t m, int64_t n,
                int64_t k_dim, int64_t n_begin, int64_t n_end);

// The same product by a plain loop: what RowGemmF32 runs without AVX-512F;
// public so that its test covers it on every CPU.
void RowGemmF32Portable(const float* x, const float* w, float* y, int64_t m,
                        int64_t n, int64_t k_dim, int64_t n_begin,
                        int64_t n_end);

}  // namespace tandem::kernels
