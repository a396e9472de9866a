#pragma once

// Finite checks of floating-point weight bytes, for refusing poisoned
// weights where they enter a process (a checkpoint loaded from disk, a
// version received by a weight transport) before anything computes with
// them.
//
// Values are classified by bit pattern, never as numbers (no FP exceptions,
// no slow paths on denormals): an element is non-finite when every bit of
// its exponent is set (an infinity or a NaN). The scan is one pass at
// memory bandwidth: blocks of elements are OR-reduced branch-free (SSE2,
// 32 bytes a step), and only a block that holds a non-finite value is
// searched element by element.
//
// All functions are thread-safe and do not allocate.

#include <cstdint>
#include <optional>

#include "absl/types/span.h"

namespace tandem::kernels {

enum class FloatFormat { kF32, kBF16, kF16 };

// Size in bytes of one element of `format`.
inline constexpr uint64_t FloatFormatSize(FloatFormat format) {
  return format == FloatFormat::kF32 ? 4 : 2;
}

// "F32", "BF16" or "F16".
const char* FloatFormatName(FloatFormat format);

struct NonFiniteValue {
  uint64_t index = 0;  // element index inside the scanned bytes
  bool nan = false;    // NaN; otherwise an infinity
  bool negative = false;
};

// The first non-finite element of `bytes` read as little-endian `format`
// elements, or nullopt when all are finite. A trailing partial element is
// ignored. `bytes` needs no alignment.
std::optional<NonFiniteValue> FindNonFinite(absl::Span<const uint8_t> bytes,
                                            FloatFormat format);

// "NaN", "+Inf" or "-Inf".
const char* NonFiniteName(const NonFiniteValue& value);

}  // namespace tandem::kernels
