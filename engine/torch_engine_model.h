#pragma once

// The engine's LibTorch adapter: an EngineModel over the shared decoder
// (common/model/) that keeps one ContiguousKvCache per sequence and runs
// each engine step as one DecoderModel::ForwardWithCache call. LibTorch
// stays behind this class: this header includes none of it.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/engine_model.h"

namespace at {
class Tensor;
}  // namespace at

namespace tandem::model {
class DecoderModel;
class KvCache;
}  // namespace tandem::model

namespace tandem::engine {

// Where ForwardSample samples: kDevice = in LibTorch on the [rows, vocab]
// logits where they are (SampleRows: only ids and log-probs cross to the
// host, and on the CPU no per-row copy and double-precision pass over the
// vocabulary); kHost = the logits copied into a std::vector and sampled by
// the host sampler (engine/sampler.h; tests compare the two); kAuto =
// kDevice on every device (issue 20: 1.02-1.06x decode at batch 32 on the
// CPU, docs/benchmarks.md).
enum class SampleWhere { kAuto, kHost, kDevice };

struct TorchEngineModelOptions {
  SampleWhere sampling = SampleWhere::kAuto;
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

 private:
  // The step's forward pass; *logits = float32 rows of the chunks with
  // wants_logits, in order, on the weights' device.
  absl::Status RunStep(const std::vector<ForwardChunk>& chunks,
                       at::Tensor* logits);

  std::shared_ptr<const model::DecoderModel> model_;
  const TorchEngineModelOptions options_;
  const int64_t max_tokens_;
  std::map<uint64_t, std::unique_ptr<model::KvCache>> caches_;
};

}  // namespace tandem::engine
