#pragma once

// The engine's LibTorch adapter: an EngineModel over the shared decoder
// (common/model/) that keeps one KV cache per sequence and runs each
// engine step as one DecoderModel::ForwardWithCache call. The caches are
// ContiguousKvCaches (one growable tensor per layer and sequence) or
// PagedKvCaches over one KvBlockPool sized like the engine's BlockManager
// (common/model/paged_kv_cache.h), by TorchEngineModelOptions::kv_layout.
// LibTorch stays behind this class: this header includes none of it.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/model/paged_attention.h"
#include "engine/engine_model.h"

namespace at {
class Tensor;
}  // namespace at

namespace tandem::model {
class DecoderModel;
class KvBlockPool;
class KvCache;
}  // namespace tandem::model

namespace tandem::engine {

class DecodeGraphs;

// Where ForwardSample samples: kDevice = in LibTorch on the [rows, vocab]
// logits where they are (SampleRows: only ids and log-probs cross to the
// host, and on the CPU no per-row copy and double-precision pass over the
// vocabulary); kHost = the logits copied into a std::vector and sampled by
// the host sampler (engine/sampler.h; tests compare the two); kAuto =
// kDevice on every device (issue 20: 1.02-1.06x decode at batch 32 on the
// CPU, docs/benchmarks.md).
enum class SampleWhere { kAuto, kHost, kDevice };

// How the KV caches are laid out: kContiguous = one ContiguousKvCache per
// sequence; kPaged = PagedKvCaches over one pool of kv_blocks blocks of
// block_size tokens, allocated at the first step on the weights' device;
// kAuto = kPaged whenever kv_blocks > 0 (on the CPU too: engine_bench's
// decode throughput paged / contiguous was 1.01 at batch 1, 1.47 at batch
// 8 and 1.53 at batch 32; docs/benchmarks.md), else kContiguous.
enum class KvLayout { kAuto, kContiguous, kPaged };

struct TorchEngineModelOptions {
  SampleWhere sampling = SampleWhere::kAuto;
  KvLayout kv_layout = KvLayout::kAuto;
  // The paged pool: the engine's EngineOptions::num_kv_blocks and
  // block_size, so that the pool holds whatever the scheduler admits.
  // kv_blocks 0 = no pool (kPaged then fails the first step).
  int64_t kv_blocks = 0;
  int64_t block_size = 16;
  // Decode-only steps of paged caches on a CUDA device replay CUDA graphs
  // (engine/decode_graphs.h); ignored elsewhere. Off by default until it
  // has passed tests/gpu on a GPU (docs/gpu.md).
  bool cuda_graphs = false;
  // Attention of decode-only steps over the paged pool
  // (common/model/paged_attention.h): kGather by default, like
  // cuda_graphs, until the decode kernel has passed tests/gpu on a GPU
  // (docs/gpu.md); then kAuto.
  model::PagedAttention paged_attention = model::PagedAttention::kGather;
};

class TorchEngineModel : public EngineModel {
 public:
  // `max_tokens` bounds any one sequence (prompt + generated). The model is
  // only read (forward passes, its live weights); a caller that owns it
  // elsewhere may pass a non-owning pointer that outlives this object.
  TorchEngineModel(std::shared_ptr<const model::DecoderModel> model,
                   int64_t max_tokens, TorchEngineModelOptions options = {});
  ~TorchEngineModel() override;

  int32_t vocab_size() const override;
  absl::StatusOr<std::vector<float>> Forward(
      const std::vector<ForwardChunk>& chunks) override;
  absl::StatusOr<std::vector<SampledToken>> ForwardSample(
      const std::vector<ForwardChunk>& chunks,
      const std::vector<SampleRequest>& requests) override;
  bool ForkCache(uint64_t src, uint64_t dst, int32_t num_tokens) override;
  void ReleaseCache(uint64_t seq_id) override;

  // Whether the caches are paged (kv_layout resolved on the first step;
  // false before it).
  bool paged() const { return pool_ != nullptr; }
  // Decode steps run by CUDA graph replay, and graphs captured.
  int64_t graph_replays() const;
  int64_t graph_captures() const;

 private:
  // The step's forward pass; *logits = float32 rows of the chunks with
  // wants_logits, in order, on the weights' device.
  absl::Status RunStep(const std::vector<ForwardChunk>& chunks,
                       at::Tensor* logits);
  // The decode step `chunks` (one token each, every cache paged and
  // present) by CUDA graph replay: *logits = float32 [chunks, vocab], or
  // *ran = false (nothing changed) when the step has no graph bucket.
  absl::Status RunGraphStep(const std::vector<ForwardChunk>& chunks,
                            at::Tensor* logits, bool* ran);
  // *logits = float32 rows of `all` (one per chunk) whose chunks have
  // wants_logits, in order.
  static absl::Status SelectWanted(const std::vector<ForwardChunk>& chunks,
                                   at::Tensor all, at::Tensor* logits);
  // A new, empty cache of the resolved layout for `seq`.
  absl::StatusOr<std::unique_ptr<model::KvCache>> NewCache(const Sequence& seq);

  std::shared_ptr<const model::DecoderModel> model_;
  const TorchEngineModelOptions options_;
  const int64_t max_tokens_;
  bool layout_resolved_ = false;
  // The paged layout's pool (null for contiguous caches); declared before
  // caches_ so that the caches, which return their blocks to it, go first.
  std::shared_ptr<model::KvBlockPool> pool_;
  // With cuda_graphs: one pool block no cache owns (graph padding rows
  // write there) and the graphs.
  std::vector<int32_t> scratch_;
  std::unique_ptr<DecodeGraphs> graphs_;
  std::map<uint64_t, std::unique_ptr<model::KvCache>> caches_;
};

}  // namespace tandem::engine
