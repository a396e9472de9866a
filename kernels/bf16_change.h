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

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"

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
  // 16 words (32 bytes) per step: mostly-equal buffers cost one OR-reduced
  // XOR of four 64-bit lanes per step, which compilers vectorise.
  for (; i + 16 <= n; i += 16) {
    uint64_t x[4], y[4];
    std::memcpy(x, a + i, sizeof(x));
    std::memcpy(y, b + i, sizeof(y));
    const uint64_t diff =
        (x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]);
    if (diff == 0) continue;
    for (size_t j = i; j < i + 16; ++j) {
      if (a[j] != b[j]) on_changed(j);
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
