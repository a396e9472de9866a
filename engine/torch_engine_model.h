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

namespace tandem::model {
class DecoderModel;
class KvCache;
}  // namespace tandem::model

namespace tandem::engine {

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

}  // namespace tandem::engine
