#pragma once

// BlockManager accounts KV-cache capacity in fixed-size blocks of
// `block_size` token slots. It only counts; where the keys and values live
// is the model's business. Not thread-safe: the engine thread owns it.

#include <cstdint>
#include <vector>

namespace tandem::engine {

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_blocks_ - num_free(); }
  double usage() const {
    return num_blocks_ == 0 ? 0.0
                            : static_cast<double>(num_used()) / num_blocks_;
  }

  // Blocks needed to hold `tokens` token slots.
  int32_t BlocksFor(int32_t tokens) const {
    return (tokens + block_size_ - 1) / block_size_;
  }
  // Grows `blocks` so it covers `tokens` slots. Returns false (and changes
  // nothing) when not enough blocks are free.
  bool EnsureCapacity(std::vector<int32_t>* blocks, int32_t tokens);
  // Returns every block in `blocks` to the free list and clears it.
  void Release(std::vector<int32_t>* blocks);

 private:
  const int32_t num_blocks_;
  const int32_t block_size_;
  std::vector<int32_t> free_;
};

}  // namespace tandem::engine
