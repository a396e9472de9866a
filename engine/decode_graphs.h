#pragma once

// CUDA graphs for the engine's decode steps (issue 22 item 2), over the
// paged KV cache. A decode step launches a few hundred small kernels; at
// small batches on a GPU their launch cost, not the work, sets the step
// time. DecodeGraphs captures one decode step per bucket of (batch size,
// longest sequence) with static input tensors and replays it: one copy of
// the step's inputs to the device and one graph launch.
//
// Buckets: batch sizes 1, 2, 4, ..., kMaxBatch; lengths 64, 128, ...,
// kMaxLength. A step is padded to its bucket: padding rows decode token 0
// at position 0 and write their key and value into a scratch slot that no
// sequence owns; every row reads its own slots first and the scratch slot
// after them, masked. The graph bakes in the addresses of the weights it
// was captured with, so a new live version (a staged swap) drops every
// graph and the next steps capture again (in-place updates keep the
// addresses and the graphs).
//
// Built only with TANDEM_ENABLE_CUDA; elsewhere Run returns Unimplemented.
// Not thread-safe: the engine thread owns it.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::model {
class DecoderModel;
class KvBlockPool;
class ModelWeights;
}  // namespace tandem::model

namespace tandem::engine {

class DecodeGraphs {
 public:
  static constexpr int64_t kMaxBatch = 256;
  static constexpr int64_t kMaxLength = 32768;

  // `model` outlives this object; `pool` is on a CUDA device;
  // `scratch_slot` is a pool slot that no cache owns.
  DecodeGraphs(const model::DecoderModel* model,
               std::shared_ptr<model::KvBlockPool> pool, int64_t scratch_slot);
  ~DecodeGraphs();

  // Whether a step of `batch` sequences, the longest `max_length` tokens
  // (the new one included), has a bucket.
  static bool Fits(int64_t batch, int64_t max_length) {
    return batch >= 1 && batch <= kMaxBatch && max_length <= kMaxLength;
  }

  // Float32 logits [B, vocab] of a decode step on the live weights: row b
  // appends ids[b] at positions[b] into pool slot write_slots[b] and
  // attends over read_slots[b] (its slots, the new one last). Captures the
  // bucket's graph on first use. REQUIRES: Fits(B, longest read_slots).
  absl::StatusOr<at::Tensor> Run(
      const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
      const std::vector<int64_t>& write_slots,
      const std::vector<std::vector<int64_t>>& read_slots);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  struct Graph;

  const model::DecoderModel* const model_;
  const std::shared_ptr<model::KvBlockPool> pool_;
  const int64_t scratch_slot_;
  // The weights the graphs were captured with (kept alive: the graphs
  // read their memory) and RoPE's inverse frequencies on the device.
  std::shared_ptr<model::ModelWeights> weights_;
  at::Tensor inv_freq_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs_;
  int64_t captures_ = 0;
  int64_t replays_ = 0;
};

}  // namespace tandem::engine
