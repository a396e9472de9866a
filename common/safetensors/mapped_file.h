#pragma once

// A read-only memory mapping of a whole file.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::safetensors {

// Owns a read-only, private mapping of a file; unmaps on destruction.
// Thread-compatible: the bytes never change through this object, so
// concurrent reads are safe.
//
// The mapping reflects the file on disk: if another process truncates the
// file while it is mapped, touching the lost pages raises SIGBUS. Writers in
// Tandem replace files by rename, which leaves existing mappings intact.
class MappedFile {
 public:
  // Maps `path`. An empty file yields a valid object with size() == 0 and
  // data() == nullptr. Errors: NotFound / PermissionDenied / Internal with
  // the path and the system error.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  const uint8_t* data_;
  size_t size_;
};

}  // namespace tandem::safetensors
