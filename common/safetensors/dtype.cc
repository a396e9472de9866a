#include "common/safetensors/dtype.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::safetensors {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "BOOL";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kU16:
      return "U16";
    case DType::kI16:
      return "I16";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kU32:
      return "U32";
    case DType::kI32:
      return "I32";
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kU64:
      return "U64";
    case DType::kI64:
      return "I64";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "INVALID";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (DTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
    case DType::kU16:
    case DType::kI16:
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU32:
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kF64:
    case DType::kU64:
    case DType::kI64:
      return 8;
  }
  return 0;
}

absl::StatusOr<uint64_t> CheckedNumBytes(const std::vector<int64_t>& shape,
                                         size_t element_size) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  bool has_zero_dim = false;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (dim == 0) has_zero_dim = true;
  }
  // An empty tensor is empty whatever its other dimensions are, so the
  // overflow check must not depend on where the zero is.
  if (has_zero_dim) return 0;
  uint64_t count = 1;
  for (int64_t dim : shape) {
    const uint64_t d = static_cast<uint64_t>(dim);
    if (count > kMax / d) {
      return absl::OutOfRangeError(absl::StrCat(
          "shape ", ShapeToString(shape), " element count overflows 64 bits"));
    }
    count *= d;
  }
  if (element_size != 0 && count > kMax / element_size) {
    return absl::OutOfRangeError(absl::StrCat("shape ", ShapeToString(shape),
                                              " byte size overflows 64 bits"));
  }
  return count * element_size;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace tandem::safetensors
