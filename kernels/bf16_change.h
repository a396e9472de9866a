#pragma once

// Change detection between two consecutive versions of a bf16 weight buffer.
//
// Buffers are compared as raw 16-bit words, never as numbers: a word counts
// as changed when its bit pattern differs, so -0.0 vs +0.0 and NaNs with
// different payloads are changes, and an identical NaN is not. This is what
// makes delta replay bit-exact (an analytic "will Adam move this weight"
// mask misses most real changes). Any dtype can be compared this way; for
// 4-byte dtypes each half is a word of its own.
//
// All functions are thread-safe and allocate only into their outputs.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tandem::kernels {

// Calls `on_changed(i)` for every i with prev[i] != next[i], in increasing
// order. REQUIRES: prev.size() == next.size(). Inline so encoders can fuse
// detection with their own per-element work.
template <typename F>
void ForEachChangedWord(absl::Span<const uint16_t> prev,
                        absl::Span<const uint16_t> next, F&& on_changed) {
  const uint16_t* a = prev.data();
  const uint16_t* b = next.data();
  const size_t n = prev.size();
  size_t i = 0;
  // 16 words (32 bytes) per step. Equal steps cost one compare; a step with
  // changes yields a 16-bit mask whose set bits are visited directly, so
  // dense changes do not pay a branch per word.
  for (; i + 16 <= n; i += 16) {
#if defined(__SSE2__)
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    const __m128i x1 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8));
    const __m128i y0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    const __m128i y1 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8));
    const __m128i eq =
        _mm_packs_epi16(_mm_cmpeq_epi16(x0, y0), _mm_cmpeq_epi16(x1, y1));
    uint32_t mask = ~static_cast<uint32_t>(_mm_movemask_epi8(eq)) & 0xFFFFu;
#else
    uint32_t mask = 0;
    for (int j = 0; j < 16; ++j) mask |= uint32_t{a[i + j] != b[i + j]} << j;
#endif
    while (mask != 0) {
      on_changed(i + static_cast<size_t>(std::countr_zero(mask)));
      mask &= mask - 1;
    }
  }
  for (; i < n; ++i) {
    if (a[i] != b[i]) on_changed(i);
  }
}

// Appends the indices of the words that differ to `changed` (which is not
// cleared). REQUIRES: prev.size() == next.size().
void FindChangedWords(absl::Span<const uint16_t> prev,
                      absl::Span<const uint16_t> next,
                      std::vector<uint64_t>* changed);

// Number of words that differ. REQUIRES: prev.size() == next.size().
uint64_t CountChangedWords(absl::Span<const uint16_t> prev,
                           absl::Span<const uint16_t> next);

// Views `bytes` (whose size must be even) as 16-bit words. The storage must
// be 2-byte aligned, as flat weight buffers are.
absl::Span<const uint16_t> AsWords(absl::Span<const uint8_t> bytes);
absl::Span<uint16_t> AsMutableWords(absl::Span<uint8_t> bytes);

}  // namespace tandem::kernels
