#pragma once

// Element types of the safetensors format and their on-disk names.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::safetensors {

// Every dtype the safetensors format defines. The on-disk spelling is the
// enumerator name without the `k` and with `_` kept (e.g. kF8E4M3 is
// "F8_E4M3"); see DTypeName().
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kF64,
  kU64,
  kI64,
  kF8E4M3,
  kF8E5M2,
};

// All dtypes, in enum order; handy for tests and exhaustive switches.
inline constexpr std::array<DType, 15> kAllDTypes = {
    DType::kBool, DType::kU8,   DType::kI8,  DType::kU16,    DType::kI16,
    DType::kF16,  DType::kBF16, DType::kU32, DType::kI32,    DType::kF32,
    DType::kF64,  DType::kU64,  DType::kI64, DType::kF8E4M3, DType::kF8E5M2};

// The on-disk name of `dtype`, e.g. "BF16".
absl::string_view DTypeName(DType dtype);

// Parses an on-disk name (case-sensitive, as the format requires).
// Returns InvalidArgument "unknown dtype 'X'" for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Size of one element in bytes (BOOL is one byte).
size_t DTypeSize(DType dtype);

// Number of elements of a tensor with `shape` (1 for a scalar, shape {}).
// Returns InvalidArgument for a negative dimension and OutOfRange when the
// count, or the count times `element_size`, does not fit in 64 bits.
// `element_size` may be 1 to get a plain element count check.
absl::StatusOr<uint64_t> CheckedNumBytes(const std::vector<int64_t>& shape,
                                         size_t element_size);

// "[2,3,4]" — the spelling used in error messages.
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace tandem::safetensors
