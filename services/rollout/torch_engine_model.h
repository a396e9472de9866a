#pragma once

// The engine's view of the shared LibTorch decoder (common/model/): an
// EngineModel that keeps one ContiguousKvCache per sequence and runs each
// engine step as one DecoderModel::ForwardWithCache call, and a
// WeightUpdateSource that commits staged weights into that decoder.
// LibTorch stays behind these two classes: this header includes none of it.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "services/rollout/engine/engine_model.h"

namespace tandem::tokenizer {
class Tokenizer;
}  // namespace tandem::tokenizer

namespace tandem::model {
class DecoderModel;
class KvCache;
class ModelWeights;
}  // namespace tandem::model

namespace tandem::rollout {

// A decoder ready to generate, with its tokenizer.
struct LoadedModel {
  std::shared_ptr<model::DecoderModel> decoder;
  std::shared_ptr<tokenizer::Tokenizer> tokenizer;
  std::vector<int32_t> eos_token_ids;
  // Longest sequence the model supports (max_position_embeddings).
  int64_t max_tokens = 0;
  std::string description;
};

// Loads a Hugging Face model directory (config.json, *.safetensors,
// tokenizer.json). An empty `path` gives the built-in tiny model of the
// arithmetic task (BuiltinTinyModelConfig) with random weights from `seed`
// and the task's character tokenizer. `torch_threads` > 0 sets LibTorch's
// intra-op threads for this process.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path, uint64_t seed,
                                      int32_t torch_threads);

class TorchEngineModel : public EngineModel {
 public:
  // `max_tokens` bounds any one sequence (prompt + generated).
  TorchEngineModel(std::shared_ptr<model::DecoderModel> model,
                   int64_t max_tokens);
  ~TorchEngineModel() override;

  int32_t vocab_size() const override;
  absl::StatusOr<std::vector<float>> Forward(
      const std::vector<ForwardChunk>& chunks) override;
  bool ForkCache(uint64_t src, uint64_t dst, int32_t num_tokens) override;
  void ReleaseCache(uint64_t seq_id) override;

 private:
  std::shared_ptr<model::DecoderModel> model_;
  const int64_t max_tokens_;
  std::map<uint64_t, std::unique_ptr<model::KvCache>> caches_;
};

// Weights staged by a transport (any thread) and committed by the engine
// thread at a step boundary. In staged mode Commit swaps pointers (the
// pause does not depend on model size); in inplace mode the staged values
// are copied into the live tensors during the pause (one copy of the
// weights in memory once the staged buffer is dropped).
class StagedWeightSource : public WeightUpdateSource {
 public:
  enum class Mode { kStaged, kInplace };
  StagedWeightSource(std::shared_ptr<model::DecoderModel> model, Mode mode);
  ~StagedWeightSource() override;

  // Thread-safe. Replaces any older staged version.
  void Stage(uint64_t version, std::shared_ptr<model::ModelWeights> weights);

  uint64_t ReadyVersion(uint64_t live) override;
  absl::Status Commit(uint64_t version) override;

 private:
  std::shared_ptr<model::DecoderModel> model_;
  const Mode mode_;
  absl::Mutex mu_;
  uint64_t staged_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<model::ModelWeights> staged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
