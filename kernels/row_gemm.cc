#include "kernels/row_gemm.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem::kernels {

void RowGemmF32Portable(const float* x, const float* w, float* y, int64_t m,
                        int64_t n, int64_t k_dim, int64_t n_begin,
                        int64_t n_end) {
  for (int64_t j = n_begin; j < n_end; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int64_t k = 0; k < k_dim; ++k) {
        sum += x[i * k_dim + k] * w[j * k_dim + k];
      }
      y[i * n + j] = sum;
    }
  }
}

namespace {

#if defined(__x86_64__)
#define TANDEM_ROW_GEMM_STEP(LOAD)                                        \
  {                                                                       \
    const __m512 v0 = LOAD(w0 + k), v1 = LOAD(w1 + k), v2 = LOAD(w2 + k), \
                 v3 = LOAD(w3 + k);                                       \
    __m512 u = LOAD(x0 + k);                                              \
    a00 = _mm512_fmadd_ps(u, v0, a00);                                    \
    a01 = _mm512_fmadd_ps(u, v1, a01);                                    \
    a02 = _mm512_fmadd_ps(u, v2, a02);                                    \
    a03 = _mm512_fmadd_ps(u, v3, a03);                                    \
    u = LOAD(x1 + k);                                                     \
    a10 = _mm512_fmadd_ps(u, v0, a10);                                    \
    a11 = _mm512_fmadd_ps(u, v1, a11);                                    \
    a12 = _mm512_fmadd_ps(u, v2, a12);                                    \
    a13 = _mm512_fmadd_ps(u, v3, a13);                                    \
    u = LOAD(x2 + k);                                                     \
    a20 = _mm512_fmadd_ps(u, v0, a20);                                    \
    a21 = _mm512_fmadd_ps(u, v1, a21);                                    \
    a22 = _mm512_fmadd_ps(u, v2, a22);                                    \
    a23 = _mm512_fmadd_ps(u, v3, a23);                                    \
    u = LOAD(x3 + k);                                                     \
    a30 = _mm512_fmadd_ps(u, v0, a30);                                    \
    a31 = _mm512_fmadd_ps(u, v1, a31);                                    \
    a32 = _mm512_fmadd_ps(u, v2, a32);                                    \
    a33 = _mm512_fmadd_ps(u, v3, a33);                                    \
  }

// Columns [n_begin, n_end) in groups of 4 rows of w, each against all rows
// of x in groups of 4: 16 accumulators of 16 lanes. A short group repeats
// its last row (computed twice, stored once).
__attribute__((target("avx512f,fma"))) void RowGemmAvx512(
    const float* x, const float* w, float* y, int64_t m, int64_t n,
    int64_t k_dim, int64_t n_begin, int64_t n_end) {
  const int64_t full = k_dim & ~int64_t{15};
  const __mmask16 tail =
      static_cast<__mmask16>((1u << static_cast<unsigned>(k_dim - full)) - 1);
  for (int64_t j0 = n_begin; j0 < n_end; j0 += 4) {
    const int64_t nn = std::min<int64_t>(4, n_end - j0);
    const float* w0 = w + j0 * k_dim;
    const float* w1 = w + (j0 + std::min<int64_t>(1, nn - 1)) * k_dim;
    const float* w2 = w + (j0 + std::min<int64_t>(2, nn - 1)) * k_dim;
    const float* w3 = w + (j0 + std::min<int64_t>(3, nn - 1)) * k_dim;
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int64_t mm = std::min<int64_t>(4, m - i0);
      const float* x0 = x + i0 * k_dim;
      const float* x1 = x + (i0 + std::min<int64_t>(1, mm - 1)) * k_dim;
      const float* x2 = x + (i0 + std::min<int64_t>(2, mm - 1)) * k_dim;
      const float* x3 = x + (i0 + std::min<int64_t>(3, mm - 1)) * k_dim;
      __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
      __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
      __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
      __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
      int64_t k = 0;
      for (; k < full; k += 16) TANDEM_ROW_GEMM_STEP(_mm512_loadu_ps)
      if (tail != 0) {
#define TANDEM_ROW_GEMM_TAIL_LOAD(p) _mm512_maskz_loadu_ps(tail, p)
        TANDEM_ROW_GEMM_STEP(TANDEM_ROW_GEMM_TAIL_LOAD)
#undef TANDEM_ROW_GEMM_TAIL_LOAD
      }
      const __m512 acc[4][4] = {{a00, a01, a02, a03},
                                {a10, a11, a12, a13},
                                {a20, a21, a22, a23},
                                {a30, a31, a32, a33}};
      for (int64_t i = 0; i < mm; ++i) {
        for (int64_t j = 0; j < nn; ++j) {
          y[(i0 + i) * n + j0 + j] = _mm512_reduce_add_ps(acc[i][j]);
        }
      }
    }
  }
}
#undef TANDEM_ROW_GEMM_STEP
#endif

}  // namespace

bool RowGemmF32Fast() {
#if defined(__x86_64__)
  static const bool fast =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return fast;
#else
  return false;
#endif
}

void RowGemmF32(const float* x, const float* w, float* y, int64_t m, int64_t n,
                int64_t k_dim, int64_t n_begin, int64_t n_end) {
#if defined(__x86_64__)
  if (RowGemmF32Fast()) {
    RowGemmAvx512(x, w, y, m, n, k_dim, n_begin, n_end);
    return;
  }
#endif
  RowGemmF32Portable(x, w, y, m, n, k_dim, n_begin, n_end);
}

}  // namespace tandem::kernels
