#include "engine/decode_graphs.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/model/paged_kv_cache.h"

#if TANDEM_ENABLE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tandem::engine {
namespace {

int64_t RoundUpToPowerOfTwo(int64_t n, int64_t at_least) {
  int64_t p = at_least;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

struct DecodeGraphs::Graph {
#if TANDEM_ENABLE_CUDA
  at::cuda::CUDAGraph graph;
#endif
  bool captured = false;
  // ids | positions | write slots | lengths | read slots, [4 B + B L]
  // int64 on the device: the graph's static input.
  at::Tensor inputs;
  at::Tensor logits;  // the captured output [B, vocab]
};

DecodeGraphs::DecodeGraphs(const model::DecoderModel* model,
                           std::shared_ptr<model::KvBlockPool> pool,
                           int64_t scratch_slot)
    : model_(model), pool_(std::move(pool)), scratch_slot_(scratch_slot) {}

DecodeGraphs::~DecodeGraphs() = default;

absl::StatusOr<at::Tensor> DecodeGraphs::Run(
    const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
    const std::vector<int64_t>& write_slots,
    const std::vector<std::vector<int64_t>>& read_slots) {
#if !TANDEM_ENABLE_CUDA
  (void)ids;
  (void)positions;
  (void)write_slots;
  (void)read_slots;
  return absl::UnimplementedError(
      "CUDA graphs: this build has no CUDA (TANDEM_ENABLE_CUDA off)");
#else
  const int64_t batch = static_cast<int64_t>(ids.size());
  size_t longest = 1;
  for (const auto& r : read_slots) longest = std::max(longest, r.size());
  const int64_t bucket_batch = RoundUpToPowerOfTwo(batch, 1);
  const int64_t bucket_length =
      RoundUpToPowerOfTwo(static_cast<int64_t>(longest), 64);
  try {
    c10::InferenceMode inference_mode;
    const std::shared_ptr<model::ModelWeights> live = model_->weights();
    if (live != weights_) {
      graphs_.clear();  // captured with the old weights' addresses
      weights_ = live;
      inv_freq_ = model_->rope_inverse_frequencies().to(pool_->device());
    }
    std::unique_ptr<Graph>& g = graphs_[{bucket_batch, bucket_length}];
    const int64_t size = 4 * bucket_batch + bucket_batch * bucket_length;
    if (g == nullptr) {
      g = std::make_unique<Graph>();
      g->inputs = at::empty(
          {size}, at::TensorOptions().dtype(at::kLong).device(pool_->device()));
    }
    // A fresh pinned buffer per step: the caching host allocator keeps it
    // until the asynchronous copy below is done.
    const at::Tensor host = at::empty(
        {size}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    // Padding rows: token 0 at position 0, written to and read from the
    // scratch slot; every row's reads past its length hit the scratch slot.
    int64_t* h = host.data_ptr<int64_t>();
    std::fill(h, h + size, scratch_slot_);
    for (int64_t b = 0; b < bucket_batch; ++b) {
      const bool real = b < batch;
      h[b] = real ? ids[b] : 0;
      h[bucket_batch + b] = real ? positions[b] : 0;
      h[2 * bucket_batch + b] = real ? write_slots[b] : scratch_slot_;
      h[3 * bucket_batch + b] =
          real ? static_cast<int64_t>(read_slots[b].size()) : 1;
      if (real) {
        std::copy(read_slots[b].begin(), read_slots[b].end(),
                  h + 4 * bucket_batch + b * bucket_length);
      }
    }
    // On the current stream, before the replay that reads it.
    g->inputs.copy_(host, /*non_blocking=*/true);
    const auto forward = [&] {
      const at::Tensor& in = g->inputs;
      const auto plan = model::PagedBatch::ForDecode(
          pool_.get(), in.narrow(0, 2 * bucket_batch, bucket_batch),
          in.narrow(0, 4 * bucket_batch, bucket_batch * bucket_length),
          in.narrow(0, 3 * bucket_batch, bucket_batch), bucket_length);
      return model_->DecodeOnDevice(
          *live, inv_freq_, in.narrow(0, 0, bucket_batch),
          in.narrow(0, bucket_batch, bucket_batch), *plan);
    };
    if (!g->captured) {
      // Capture on a side stream (CUDA graphs cannot capture the legacy
      // default stream) after one eager run that initialises the kernels'
      // lazy state; the eager run computes this very step, which the
      // replay below recomputes identically.
      c10::cuda::getCurrentCUDAStream().synchronize();
      c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
      {
        c10::cuda::CUDAStreamGuard guard(side);
        (void)forward();
        side.synchronize();
        g->graph.capture_begin();
        g->logits = forward();
        g->graph.capture_end();
      }
      side.synchronize();
      g->captured = true;
      ++captures_;
    }
    g->graph.replay();
    ++replays_;
    // The next replay overwrites the static output.
    return g->logits.narrow(0, 0, batch).clone();
  } catch (const std::exception& e) {
    graphs_.erase({bucket_batch, bucket_length});
    return absl::InternalError(absl::StrCat(
        "CUDA graph decode step (batch ", batch, " in bucket ", bucket_batch,
        ", length ", longest, " in bucket ", bucket_length, "): ", e.what()));
  }
#endif
}

}  // namespace tandem::engine
