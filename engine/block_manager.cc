#include "engine/block_manager.h"

namespace tandem::engine {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

bool BlockManager::EnsureCapacity(std::vector<int32_t>* blocks,
                                  int32_t tokens) {
  const int32_t needed =
      BlocksFor(tokens) - static_cast<int32_t>(blocks->size());
  if (needed <= 0) return true;
  if (needed > num_free()) return false;
  for (int32_t i = 0; i < needed; ++i) {
    blocks->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockManager::Release(std::vector<int32_t>* blocks) {
  for (int32_t b : *blocks) free_.push_back(b);
  blocks->clear();
}

}  // namespace tandem::engine
