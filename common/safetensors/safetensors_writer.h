#pragma once

// Writer for the safetensors format (see safetensors_file.h for the layout).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/safetensors/dtype.h"

namespace tandem::safetensors {

// One tensor to write. `bytes` is borrowed: it holds numel * DTypeSize(dtype)
// little-endian elements and must stay valid during the write call.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> bytes;
};

// The 8-byte length prefix plus the JSON header for `tensors`, laid out in
// the given order, padded with spaces so that the data buffer starts at a
// multiple of 8 bytes. Errors (InvalidArgument, naming the tensor): a name
// that is "__metadata__", repeated, or not valid UTF-8; a negative
// dimension or overflowing shape; `bytes` of the wrong size.
absl::StatusOr<std::string> SafetensorsHeader(
    absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata);

// Writes `tensors` and `metadata` ("__metadata__"; omitted when empty) to
// `path` atomically (see WriteFileAtomically): readers never see a partial
// file. Error messages start with `path`.
absl::Status WriteSafetensors(
    const std::string& path, absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata = {});

// The bytes WriteSafetensors would write, in memory. Meant for small files
// (tests, fuzzing, control messages): it copies every tensor.
absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem::safetensors
