#include "kernels/row_gemm.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem::kernels {

namespace {

void RowGemmPortable(const float* x, const float* w, float* y, int64_t m,
                     int64_t n, int64_t k_dim, int64_t n_begin, int64_t n_end) {
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

// AVX2 + FMA (16 registers of 8 lanes). A tile of MR rows of x by NR rows
// of w holds MR * NR accumulators; per 8 values of k it loads the smaller
// side into registers once and streams the larger one through a single
// register, so MR * NR + min(MR, NR) + 1 registers must stay within 16.
#define TANDEM_AVX2 __attribute__((target("avx2,fma")))
#define TANDEM_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline))

template <bool kMasked>
TANDEM_AVX2_INLINE inline __m256 LoadAvx2(const float* p, __m256i mask) {
  if constexpr (kMasked) {
    return _mm256_maskload_ps(p, mask);
  } else {
    return _mm256_loadu_ps(p);
  }
}

template <int MR, int NR, bool kMasked>
TANDEM_AVX2_INLINE inline void StepAvx2(const float* const (&xr)[MR],
                                        const float* const (&wr)[NR],
                                        int64_t k, __m256i mask,
                                        __m256 (&acc)[MR][NR]) {
  if constexpr (NR <= MR) {
    __m256 v[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) v[j] = LoadAvx2<kMasked>(wr[j] + k, mask);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 u = LoadAvx2<kMasked>(xr[i] + k, mask);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm256_fmadd_ps(u, v[j], acc[i][j]);
      }
    }
  } else {
    __m256 u[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) u[i] = LoadAvx2<kMasked>(xr[i] + k, mask);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m256 v = LoadAvx2<kMasked>(wr[j] + k, mask);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm256_fmadd_ps(u[i], v, acc[i][j]);
      }
    }
  }
}

// The lane sums of a, b, c and d, in that order.
TANDEM_AVX2_INLINE inline __m128 Sum4Avx2(__m256 a, __m256 b, __m256 c,
                                          __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Accumulator t of a tile in row-major order, zero past its end.
template <int MR, int NR>
TANDEM_AVX2_INLINE inline __m256 AccAvx2(const __m256 (&acc)[MR][NR], int t,
                                         __m256 zero) {
  return t < MR * NR ? acc[t / NR][t % NR] : zero;
}

// y[i * n + j] for the first x_rows (<= MR) rows of x and w_rows (<= NR)
// rows of w from x, w; a short tile repeats its last row (computed, not
// stored).
template <int MR, int NR>
TANDEM_AVX2_INLINE inline void TileAvx2(const float* x, int64_t x_rows,
                                        const float* w, int64_t w_rows,
                                        int64_t k_dim, float* y, int64_t n) {
  const float* xr[MR];
  const float* wr[NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    xr[i] = x + std::min<int64_t>(i, x_rows - 1) * k_dim;
  }
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) {
    wr[j] = w + std::min<int64_t>(j, w_rows - 1) * k_dim;
  }
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int64_t full = k_dim & ~int64_t{7};
  const __m256i none = _mm256_setzero_si256();
  // Two steps per iteration: 7-24 % less time than one on one decode
  // step's products (AVX2-only EPYC, 32, 8 and 2 rows); four were no
  // better.
#pragma GCC unroll 2
  for (int64_t k = 0; k < full; k += 8) {
    StepAvx2<MR, NR, false>(xr, wr, k, none, acc);
  }
  if (full < k_dim) {
    // Lane l loads when l < k_dim - full (maskload reads the sign bit).
    const __m256i mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(static_cast<int>(k_dim - full)),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    StepAvx2<MR, NR, true>(xr, wr, full, mask, acc);
  }
  constexpr int kTiles = MR * NR;
  alignas(16) float sums[(kTiles + 3) / 4 * 4];
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int t = 0; t < kTiles; t += 4) {
    _mm_store_ps(sums + t, Sum4Avx2(AccAvx2(acc, t, zero),
                                    AccAvx2(acc, t + 1, zero),
                                    AccAvx2(acc, t + 2, zero),
                                    AccAvx2(acc, t + 3, zero)));
  }
  for (int64_t i = 0; i < x_rows; ++i) {
    for (int64_t j = 0; j < w_rows; ++j) y[i * n + j] = sums[i * NR + j];
  }
}

// Rows [i0, m) of x, fewer than R of them, against one group of w rows.
template <int R, int NR>
TANDEM_AVX2_INLINE inline void RowTailAvx2(const float* x, int64_t i0,
                                           int64_t m, const float* w,
                                           int64_t w_rows, int64_t k_dim,
                                           float* y, int64_t n) {
  if constexpr (R > 1) {
    if (m - i0 == R - 1) {
      TileAvx2<R - 1, NR>(x + i0 * k_dim, R - 1, w, w_rows, k_dim, y + i0 * n,
                          n);
    } else {
      RowTailAvx2<R - 1, NR>(x, i0, m, w, w_rows, k_dim, y, n);
    }
  }
}

// Columns [n_begin, n_end) in groups of NR rows of w, each against all rows
// of x in groups of MR (the last group, if short, by a tile of its size).
template <int MR, int NR>
TANDEM_AVX2 void RowGemmAvx2Tiles(const float* x, const float* w, float* y,
                                  int64_t m, int64_t n, int64_t k_dim,
                                  int64_t n_begin, int64_t n_end) {
  for (int64_t j0 = n_begin; j0 < n_end; j0 += NR) {
    const int64_t nn = std::min<int64_t>(NR, n_end - j0);
    const float* wj = w + j0 * k_dim;
    int64_t i0 = 0;
    for (; i0 + MR <= m; i0 += MR) {
      TileAvx2<MR, NR>(x + i0 * k_dim, MR, wj, nn, k_dim, y + i0 * n + j0, n);
    }
    if (i0 < m) RowTailAvx2<MR, NR>(x, i0, m, wj, nn, k_dim, y + j0, n);
  }
}
#undef TANDEM_AVX2_INLINE
#undef TANDEM_AVX2
#endif

}  // namespace

bool RowGemmF32Supports(RowGemmPath path) {
  switch (path) {
    case RowGemmPath::kPortable:
      return true;
#if defined(__x86_64__)
    case RowGemmPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case RowGemmPath::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("fma");
#else
    case RowGemmPath::kAvx2:
    case RowGemmPath::kAvx512:
      return false;
#endif
  }
  return false;
}

RowGemmPath RowGemmF32Path() {
  static const RowGemmPath path =
      RowGemmF32Supports(RowGemmPath::kAvx512) ? RowGemmPath::kAvx512
      : RowGemmF32Supports(RowGemmPath::kAvx2) ? RowGemmPath::kAvx2
                                               : RowGemmPath::kPortable;
  return path;
}

bool RowGemmF32Fast() { return RowGemmF32Path() != RowGemmPath::kPortable; }

int64_t RowGemmParts(int64_t n, int64_t max_parts) {
  const int64_t groups = (n + 3) / 4;
  return std::max<int64_t>(1, std::min<int64_t>(max_parts, groups / 16));
}

ColumnRange RowGemmColumns(int64_t n, int64_t parts, int64_t part) {
  const int64_t groups = (n + 3) / 4;
  return {groups * part / parts * 4,
          std::min(n, groups * (part + 1) / parts * 4)};
}

void RowGemmF32On(RowGemmPath path, const float* x, const float* w, float* y,
                  int64_t m, int64_t n, int64_t k_dim, int64_t n_begin,
                  int64_t n_end) {
  switch (path) {
#if defined(__x86_64__)
    case RowGemmPath::kAvx512:
      RowGemmAvx512(x, w, y, m, n, k_dim, n_begin, n_end);
      return;
    case RowGemmPath::kAvx2:
      // Tiles of 4 rows of x by 3 of w (12 accumulators, 7 loads per 12
      // FMAs); for one or two rows of x, 2 x 6 (with 4 x 3 they would
      // compute repeated rows). Chosen by measurement: see row_gemm.h.
      if (m <= 2) {
        RowGemmAvx2Tiles<2, 6>(x, w, y, m, n, k_dim, n_begin, n_end);
      } else {
        RowGemmAvx2Tiles<4, 3>(x, w, y, m, n, k_dim, n_begin, n_end);
      }
      return;
#endif
    default:
      RowGemmPortable(x, w, y, m, n, k_dim, n_begin, n_end);
      return;
  }
}

void RowGemmF32(const float* x, const float* w, float* y, int64_t m, int64_t n,
                int64_t k_dim, int64_t n_begin, int64_t n_end) {
  RowGemmF32On(RowGemmF32Path(), x, w, y, m, n, k_dim, n_begin, n_end);
}

const std::vector<Avx2Tile>& RowGemmAvx2TileShapes() {
  static const std::vector<Avx2Tile> shapes = {
      {4, 3}, {3, 4}, {2, 6}, {6, 2}, {3, 3}, {2, 4}, {4, 2}};
  return shapes;
}

bool RowGemmF32Avx2Tile(Avx2Tile tile, const float* x, const float* w,
                        float* y, int64_t m, int64_t n, int64_t k_dim,
                        int64_t n_begin, int64_t n_end) {
#if defined(__x86_64__)
  if (!RowGemmF32Supports(RowGemmPath::kAvx2)) return false;
  const auto is = [&](int rows, int cols) {
    return tile.x_rows == rows && tile.w_rows == cols;
  };
  if (is(4, 3)) {
    RowGemmAvx2Tiles<4, 3>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else if (is(3, 4)) {
    RowGemmAvx2Tiles<3, 4>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else if (is(2, 6)) {
    RowGemmAvx2Tiles<2, 6>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else if (is(6, 2)) {
    RowGemmAvx2Tiles<6, 2>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else if (is(3, 3)) {
    RowGemmAvx2Tiles<3, 3>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else if (is(2, 4)) {
    RowGemmAvx2Tiles<2, 4>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else if (is(4, 2)) {
    RowGemmAvx2Tiles<4, 2>(x, w, y, m, n, k_dim, n_begin, n_end);
  } else {
    return false;
  }
  return true;
#else
  (void)tile, (void)x, (void)w, (void)y, (void)m, (void)n, (void)k_dim,
      (void)n_begin, (void)n_end;
  return false;
#endif
}

}  // namespace tandem::kernels
