#pragma once

// A zero-initialised, 64-byte aligned byte buffer holding one flat weight
// version. Alignment lets the buffer be viewed as bf16 words, float32 (Gloo)
// or wrapped by torch::from_blob without copies. Move-only; not thread-safe
// by itself (owners document who writes when).

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "absl/types/span.h"

namespace tandem::weights {

class WeightBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  WeightBuffer() = default;
  explicit WeightBuffer(uint64_t size)
      : data_(static_cast<uint8_t*>(::operator new[](
            size == 0 ? kAlignment : size, std::align_val_t{kAlignment}))),
        size_(size) {
    std::memset(data_.get(), 0, size);
  }

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }
  absl::Span<uint8_t> span() { return {data_.get(), size_}; }
  absl::Span<const uint8_t> span() const { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(uint8_t* p) const {
      ::operator delete[](p, std::align_val_t{kAlignment});
    }
  };
  std::unique_ptr<uint8_t[], Free> data_;
  uint64_t size_ = 0;
};

}  // namespace tandem::weights
