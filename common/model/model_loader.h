#pragma once

// Loading a model to generate with: a Hugging Face directory or the
// built-in tiny model of the arithmetic task, with its tokenizer. This
// header includes no LibTorch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {
class Tokenizer;
}  // namespace tandem::tokenizer

namespace tandem::model {

class DecoderModel;

// A decoder ready to generate, with its tokenizer.
struct LoadedModel {
  std::shared_ptr<DecoderModel> decoder;
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

}  // namespace tandem::model
