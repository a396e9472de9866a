#pragma once

// Zero-copy reader for the safetensors format
// (https://github.com/huggingface/safetensors):
//
//   8 bytes   little-endian u64 N, the header length
//   N bytes   JSON object: tensor name -> {"dtype", "shape", "data_offsets"}
//             plus an optional "__metadata__" string -> string map; may be
//             padded with trailing spaces
//   rest      the data buffer; data_offsets [begin, end) are relative to it
//
// Usage:
//   ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open("model.safetensors"));
//   ASSIGN_OR_RETURN(const TensorView* wte, file->Get("wte.weight"));
//   // wte->data stays valid while `file` lives.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/safetensors/dtype.h"
#include "common/safetensors/mapped_file.h"

namespace tandem::safetensors {

// Largest header accepted, as in the reference implementation. Real
// headers are a few MiB even for models with tens of thousands of tensors.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// A tensor inside a SafetensorsFile. `data` points into the file's bytes and
// is valid while the SafetensorsFile lives. `data` has no alignment
// guarantee (files written by WriteSafetensors place the data buffer at an
// 8-byte boundary, others may not); nbytes == numel * DTypeSize(dtype).
// Values are little-endian, as the format specifies.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;
  size_t nbytes;

  uint64_t numel() const;
  absl::Span<const uint8_t> bytes() const { return {data, nbytes}; }
};

// An opened, fully validated safetensors file. Immutable after creation, so
// all methods are safe to call from several threads at once.
//
// Validation is strict. Every error is InvalidArgument (I/O failures keep
// their own codes) and its message starts with the file's path and names
// the offending tensor or field, e.g.
//   "model.safetensors: tensor 'lm_head.weight': data_offsets [0, 100] but
//    dtype F32 shape [5,6] needs 120 bytes"
// Rejected: files shorter than 8 bytes; a header length of 0, above
// kMaxHeaderBytes, or past the end of the file; a header that is not a JSON
// object or repeats a key (duplicate tensor names included); an entry that
// is not an object or lacks, or mistypes, "dtype", "shape" or
// "data_offsets"; an unknown dtype; negative dimensions; an element count
// that overflows 64 bits; offsets with begin > end or end past the data
// buffer; a byte range whose size is not numel * dtype size; tensors that
// overlap; a data buffer with holes or unused trailing bytes; a
// "__metadata__" that is not a string -> string object. Unknown keys inside
// a tensor entry are ignored, as in the reference implementation.
class SafetensorsFile {
 public:
  // Maps and validates the file at `path`. The mapping stays alive as long
  // as the returned object.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  // Validates `bytes` as a whole safetensors file without copying. `source`
  // names the bytes in error messages. The object does not own the bytes.
  // REQUIRES: `bytes` outlives the returned object.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(
      absl::Span<const uint8_t> bytes, absl::string_view source);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The path given to Open(), or the `source` given to FromBuffer().
  const std::string& source() const { return source_; }

  // All tensors, ordered by their position in the data buffer.
  const std::vector<TensorView>& tensors() const { return tensors_; }

  // The tensor called `name`, or nullptr.
  const TensorView* Find(absl::string_view name) const;

  // The tensor called `name`, or NotFound naming the file and the tensor.
  absl::StatusOr<const TensorView*> Get(absl::string_view name) const;

  // The "__metadata__" map; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // Length of the JSON header in bytes (without the 8-byte length prefix).
  uint64_t header_size() const { return header_size_; }

 private:
  SafetensorsFile() = default;

  // Parses and validates `bytes`, filling everything but mapping_.
  absl::Status Parse(absl::Span<const uint8_t> bytes);

  std::string source_;
  std::unique_ptr<MappedFile> mapping_;  // Null for FromBuffer().
  uint64_t header_size_ = 0;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_by_name_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tandem::safetensors
