#pragma once

// Per-sequence key/value caches for incremental decoding.
//
// The model (DecoderModel::Prefill / DecodeStep / ForwardWithCache) talks
// to one KvCache per sequence through this interface, so an engine may keep
// keys and values however it likes: ContiguousKvCache below is one growable
// tensor per layer and sequence; PagedKvCache (paged_kv_cache.h) is a block
// table over a pool shared by an engine's sequences (Reserve allocates
// blocks, Store scatters into them, Read gathers), which ForwardWithCache
// also stores and gathers for a whole batch at once.
//
// Protocol for one forward step that adds n tokens to a sequence holding
// L = num_tokens() tokens:
//   1. Reserve(n)                 before the step; may refuse (no blocks).
//   2. for each layer:
//        Store(layer, k, v)       the n new tokens' keys/values at [L, L+n)
//        Read(layer, L + n)       keys/values of tokens [0, L+n)
//   3. Commit(n)                  after every layer succeeded.
// DecoderModel runs all three itself, Store/Read under c10::InferenceMode.
// An engine may also call Reserve earlier (at admission, to decide whether
// a sequence fits), so Reserve(n) with room already there must succeed
// without side effects. A step that fails between 1 and 3 leaves
// num_tokens() at L; the slots [L, L+n) may hold garbage and are
// overwritten by the next step.
//
// Keys are stored after RoPE (and after Qwen3's k norm), so cached entries
// never need re-rotation. Shapes: k, v passed to Store are
// [n, num_kv_heads, head_dim]; Read returns [num_kv_heads, length,
// head_dim] tensors (views allowed, any strides with a unit last stride),
// in the model's dtype and on its device.
//
// Thread safety: a KvCache belongs to one sequence and is used by one
// thread at a time; distinct caches are independent.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {

struct ModelConfig;

class KvCache {
 public:
  virtual ~KvCache() = default;

  // Tokens whose keys and values are committed.
  virtual int64_t num_tokens() const = 0;

  // Makes room for `n` more tokens. ResourceExhausted when the cache (or
  // the engine's block pool) cannot hold them; the cache is unchanged then.
  virtual absl::Status Reserve(int64_t n) = 0;

  // Writes keys/values of tokens [num_tokens(), num_tokens() + n) of
  // `layer`. REQUIRES: Reserve(n) succeeded since the last Commit.
  virtual void Store(int64_t layer, const at::Tensor& k,
                     const at::Tensor& v) = 0;

  // Keys and values of tokens [0, length) of `layer`, each
  // [num_kv_heads, length, head_dim].
  // REQUIRES: length <= num_tokens() + the n being stored in this step.
  virtual std::pair<at::Tensor, at::Tensor> Read(int64_t layer,
                                                 int64_t length) = 0;

  // Marks the `n` stored tokens as part of the sequence.
  virtual void Commit(int64_t n) = 0;

  // Forgets everything after the first `length` tokens (e.g. to recompute
  // a suffix). REQUIRES: length <= num_tokens().
  virtual void Truncate(int64_t length) = 0;
};

// One [num_kv_heads, capacity, head_dim] tensor per layer for keys and one
// for values. Capacity starts at `initial_capacity` and doubles when a
// Reserve needs more (copying the cached tokens once per doubling), up to
// `max_tokens`; Read returns views, no copies.
class ContiguousKvCache final : public KvCache {
 public:
  // `max_tokens` bounds the sequence (usually max_position_embeddings);
  // `initial_capacity` (clamped to it) sizes the first allocation, so
  // an engine that knows prompt + max_new_tokens never reallocates.
  static absl::StatusOr<std::unique_ptr<ContiguousKvCache>> Create(
      const ModelConfig& config, at::ScalarType dtype, at::Device device,
      int64_t max_tokens, int64_t initial_capacity = 256);

  int64_t num_tokens() const override { return num_tokens_; }
  absl::Status Reserve(int64_t n) override;
  void Store(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  std::pair<at::Tensor, at::Tensor> Read(int64_t layer,
                                         int64_t length) override;
  void Commit(int64_t n) override { num_tokens_ += n; }
  void Truncate(int64_t length) override { num_tokens_ = length; }

  // A new cache holding a copy of this one's tokens, e.g. to share one
  // prefilled prompt among the samples of a group.
  absl::StatusOr<std::unique_ptr<ContiguousKvCache>> Fork() const;

  int64_t capacity() const { return capacity_; }
  // Bytes held by the key and value tensors.
  int64_t allocated_bytes() const;

 private:
  ContiguousKvCache() = default;
  absl::Status Grow(int64_t min_capacity);

  int64_t num_layers_ = 0;
  int64_t num_kv_heads_ = 0;
  int64_t head_dim_ = 0;
  int64_t max_tokens_ = 0;
  int64_t capacity_ = 0;
  int64_t num_tokens_ = 0;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  std::vector<at::Tensor> keys_;    // [num_kv_heads, capacity, head_dim]
  std::vector<at::Tensor> values_;  // [num_kv_heads, capacity, head_dim]
};

}  // namespace tandem::model
