#pragma once

// Loading a model to generate with: a Hugging Face directory or the
// built-in tiny model of the arithmetic task, with its tokenizer. This
// header includes no LibTorch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

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
  // The dtype the checkpoint stores (the built-in model: float32): what a
  // trainer publishes and a rollout worker receives, whatever dtype either
  // computes in.
  WeightDType stored_dtype = WeightDType::kFloat32;
  // Longest sequence the model supports (max_position_embeddings).
  int64_t max_tokens = 0;
  std::string description;
};

// Where the loaded weights go (common/model/device.h): `device` cpu | cuda |
// cuda:N, `dtype` auto | float32 | bfloat16 (auto: bfloat16 on CUDA, the
// checkpoint's own dtype on the CPU). `key` prefixes errors ("model").
struct ModelPlacement {
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string key = "model";
};

// Loads a Hugging Face model directory (config.json, *.safetensors,
// tokenizer.json). An empty `path` gives the built-in tiny model of the
// arithmetic task (BuiltinTinyModelConfig) with random weights from `seed`
// and the task's character tokenizer. `torch_threads` > 0 sets LibTorch's
// intra-op threads for this process. The weights are placed as
// `placement` says; a device this process cannot use is FailedPrecondition
// naming "<key>.device" and the value (never a silent CPU fallback).
absl::StatusOr<LoadedModel> LoadModel(const std::string& path, uint64_t seed,
                                      int32_t torch_threads,
                                      const ModelPlacement& placement = {});

}  // namespace tandem::model
