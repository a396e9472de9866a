#pragma once

// A paged KV cache: one pool of fixed-size blocks shared by every sequence
// of an engine, each sequence a table of the blocks it holds (vLLM's
// PagedAttention layout, written here over plain LibTorch ops).
//
// KvBlockPool holds, per layer, one key and one value tensor
// [num_blocks, block_size, num_kv_heads, head_dim] on the model's device and
// in its dtype, allocated once, and a free list of block numbers. Token t of
// a sequence whose block table is `blocks` lives in slot
// blocks[t / block_size] * block_size + t % block_size of the flattened
// [num_blocks * block_size, num_kv_heads, head_dim] pool. Memory is bounded
// by the pool, not by each sequence's longest possible length, and nothing
// is ever reallocated or copied when a sequence grows.
//
// PagedKvCache implements KvCache over one pool: Reserve takes blocks from
// the free list, Store scatters the step's n tokens into their slots with
// one index_copy_ per tensor, Read gathers the sequence's slots with one
// index_select per tensor (or, while the blocks are consecutive in the pool,
// both work on a slice of it, as the contiguous cache does).
// DecoderModel::ForwardWithCache also reads the pool directly (PagedBatch
// below) to gather a whole batch with one index_select per tensor and layer.
//
// Sizing: an engine sizes the pool like its BlockManager (engine/
// block_manager.h: the same num_kv_blocks and block_size). The scheduler
// reserves at least the blocks a sequence's cache holds, and forks copy
// blocks (below), so the pool never holds more blocks than the
// BlockManager counts as used, and a step the scheduler admitted finds its
// blocks free. (The engine forks during scheduling, before it releases the
// caches that step preempted; a fork that finds the pool short then fails
// and the sample prefills its prompt instead, as without a fork.)
//
// Fork copies the shared prefix's blocks instead of sharing full blocks
// with copy-on-write. Sharing would save (G - 1) prompt copies per group
// of G samples, but the engine's BlockManager counts every sequence's
// blocks separately, so the saving could not be used for admission without
// reference counts there too; a copy is one index_select + index_copy_ per
// tensor at admission (tiny next to the prompt's prefill it replaces), and
// keeps the pool's accounting equal to the BlockManager's.
//
// Thread safety: the pool's free list is guarded by a mutex, so caches of
// one pool may reserve and release from different threads; a PagedKvCache,
// like every KvCache, is used by one thread at a time. Forward passes that
// run concurrently on caches of one pool write disjoint slots.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/model/kv_cache.h"
#include "common/model/paged_attention.h"

namespace tandem::model {

class KvBlockPool {
 public:
  // Allocates the pool's 2 * num_hidden_layers tensors. InvalidArgument for
  // non-positive sizes; ResourceExhausted (naming the bytes) when the
  // device cannot hold them. `attention` chooses the attention of the
  // decode-only steps of PagedBatches over this pool (paged_attention.h).
  static absl::StatusOr<std::shared_ptr<KvBlockPool>> Create(
      const ModelConfig& config, at::ScalarType dtype, at::Device device,
      int64_t num_blocks, int64_t block_size,
      PagedAttention attention = PagedAttention::kGather);

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_free() const;
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  PagedAttention attention() const { return attention_; }
  // Whether a decode-only step over this pool runs PagedDecodeAttention.
  bool decode_kernel() const {
    return UsesDecodeKernel(attention_);
  }
  // Bytes held by the key and value tensors of every layer.
  int64_t allocated_bytes() const;

  // Layer `layer`'s keys / values flattened to [num_blocks * block_size,
  // num_kv_heads, head_dim] (views of the pool: writes go to the pool).
  const at::Tensor& keys(int64_t layer) const { return keys_[layer]; }
  const at::Tensor& values(int64_t layer) const { return values_[layer]; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }

  // Appends `n` free blocks to `blocks`, or returns false and changes
  // nothing when fewer than `n` are free.
  bool Allocate(int64_t n, std::vector<int32_t>* blocks);
  // Returns blocks[from, end) to the free list and erases them.
  void Free(std::vector<int32_t>* blocks, size_t from = 0);

 private:
  KvBlockPool() = default;

  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  PagedAttention attention_ = PagedAttention::kGather;
  std::vector<at::Tensor> keys_;    // [num_blocks * block_size, kv_heads, dim]
  std::vector<at::Tensor> values_;  // [num_blocks * block_size, kv_heads, dim]
  mutable absl::Mutex mu_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
};

class PagedKvCache final : public KvCache {
 public:
  // A cache of at most `max_tokens` tokens on `pool` (shared: the pool
  // outlives its caches). InvalidArgument if max_tokens <= 0 or the pool
  // does not fit `config`.
  static absl::StatusOr<std::unique_ptr<PagedKvCache>> Create(
      const ModelConfig& config, std::shared_ptr<KvBlockPool> pool,
      int64_t max_tokens);
  // Returns every block to the pool.
  ~PagedKvCache() override;

  int64_t num_tokens() const override { return num_tokens_; }
  // Takes the blocks missing for num_tokens() + n tokens; ResourceExhausted
  // (cache unchanged) when the pool has too few free or max_tokens would be
  // exceeded.
  absl::Status Reserve(int64_t n) override;
  void Store(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  // [num_kv_heads, length, head_dim]: a view of the pool when the blocks
  // are consecutive in it (a sequence alone on a pool, as at batch 1),
  // else a gathered copy.
  std::pair<at::Tensor, at::Tensor> Read(int64_t layer,
                                         int64_t length) override;
  void Commit(int64_t n) override { num_tokens_ += n; }
  // Also returns the blocks past the first `length` tokens to the pool.
  void Truncate(int64_t length) override;

  // A new cache on the same pool holding a copy of this one's first
  // `length` tokens (REQUIRES: length <= num_tokens()), in blocks of its
  // own; ResourceExhausted when the pool has too few free.
  absl::StatusOr<std::unique_ptr<PagedKvCache>> Fork(int64_t length) const;

  const KvBlockPool& pool() const { return *pool_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Whether blocks() are b, b + 1, b + 2, ...: Store and Read then copy
  // into and view a slice of the pool, with no index tensors.
  bool consecutive() const { return consecutive_; }

  // Appends the pool slots of tokens [begin, end) to `slots`.
  // REQUIRES: end <= the tokens the reserved blocks cover.
  void AppendSlots(int64_t begin, int64_t end,
                   std::vector<int64_t>* slots) const;

 private:
  PagedKvCache() = default;
  // Slots of tokens [begin, end) as an int64 tensor on the pool's device,
  // remembered so that every layer of a step reuses one host copy.
  const at::Tensor& SlotIndex(int64_t begin, int64_t end);
  // Called whenever blocks_ changes.
  void BlocksChanged();

  std::shared_ptr<KvBlockPool> pool_;
  int64_t max_tokens_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<int32_t> blocks_;
  bool consecutive_ = true;
  // SlotIndex's last two answers (a step asks for its stores' and its
  // reads' range), keyed by [begin, end); cleared when blocks_ changes.
  struct CachedIndex {
    int64_t begin = -1, end = -1;
    at::Tensor index;
  };
  CachedIndex index_cache_[2];
};

// One forward step's attention over B paged caches of one pool, batched:
// the step's new keys and values go into the pool with one index_copy_ per
// tensor and layer, every sequence's keys and values come out padded to
// the longest with one index_select per tensor and layer, and one
// at::scaled_dot_product_attention (GQA, a boolean mask for padding and
// the future) serves the whole batch. The slot indices and the mask are
// built once per step and reused by every layer. On a decode-only step
// (one new token per sequence) of a pool whose decode_kernel() is set,
// PagedDecodeAttention (paged_attention.h) reads the keys and values in
// place through per-sequence block tables instead: no gather, no mask.
// Replaces, for paged caches, the per-sequence Store/Read of the KvCache
// protocol (Reserve and Commit still go through the caches).
class PagedBatch {
 public:
  // Whether every cache is a PagedKvCache and all share one pool.
  static bool SharesOnePool(absl::Span<KvCache* const> caches);

  // Whether Plan(caches, n) would run the decode kernel: every n[b] == 1
  // and the caches' pool has decode_kernel(). REQUIRES:
  // SharesOnePool(caches).
  static bool UsesKernel(absl::Span<KvCache* const> caches,
                         const std::vector<int64_t>& n);

  // nullptr unless SharesOnePool(caches).
  // caches[b] gets n[b] new tokens (REQUIRES: Reserve(n[b]) done), after
  // its num_tokens() cached ones. May throw c10::Error.
  static std::unique_ptr<PagedBatch> Plan(absl::Span<KvCache* const> caches,
                                          const std::vector<int64_t>& n);

  // A decode step's plan (one token per sequence) from tensors already on
  // the pool's device, built with device ops only (capturable in a CUDA
  // graph): write_slots [B], read_slots [B * max_length] (sequence b's
  // slots first, any slot after them), lengths [B] (tokens including the
  // new one, >= 1), all int64. With the pool's decode_kernel() the block
  // tables are read_slots' every block_size-th slot / block_size (one
  // device op per step).
  static std::unique_ptr<PagedBatch> ForDecode(const KvBlockPool* pool,
                                               at::Tensor write_slots,
                                               at::Tensor read_slots,
                                               const at::Tensor& lengths,
                                               int64_t max_length);

  // q [sum n, heads, head_dim] and the new k, v [sum n, kv_heads,
  // head_dim], sequences back to back in the order of Plan's caches;
  // stores k, v in layer `layer` of the pool and returns the attention
  // outputs [sum n, heads * head_dim]. Query i of sequence b sees its keys
  // [0, num_tokens + i]. May throw c10::Error.
  at::Tensor Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, double scale) const;

 private:
  PagedBatch() = default;

  const KvBlockPool* pool_ = nullptr;
  int64_t batch_ = 0;
  int64_t max_n_ = 0;
  int64_t max_length_ = 0;
  bool kernel_ = false;     // PagedDecodeAttention instead of the gather
  at::Tensor write_slots_;  // [sum n] pool slots of the new tokens
  // Kernel: [B, ceil(max_length / block_size)] block numbers and [B]
  // lengths; else undefined.
  at::Tensor tables_;
  at::Tensor lengths_;
  // Gather (all undefined with the kernel):
  at::Tensor read_slots_;   // [B * max_length] padded with slot 0
  at::Tensor query_rows_;   // [sum n] row b * max_n + i of each query, or
                            // undefined when every n[b] == max_n
  at::Tensor visible_;      // [B, 1, max_n, max_length] bool
};

}  // namespace tandem::model
