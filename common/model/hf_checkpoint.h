#pragma once

// Hugging Face model directories: config.json + model.safetensors (or
// shards with model.safetensors.index.json) + tokenizer files.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<ModelWeights> weights,
//                    LoadHfModel("/models/Qwen2.5-0.5B"));
//   DecoderModel model(weights);
//   ...
//   RETURN_IF_ERROR(SaveHfModel(*weights, "/ckpt/step-100",
//                               {.tokenizer_dir = "/models/Qwen2.5-0.5B"}));
//
// What we write loads in transformers (AutoModelForCausalLM.from_pretrained)
// and in other safetensors readers: HF tensor names, "format": "pt"
// metadata, config.json with every field transformers needs.

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/safetensors/sharded_checkpoint.h"

namespace tandem::model {

struct LoadOptions {
  at::Device device = at::kCPU;
  // Weight (and compute) dtype; default: config.json's torch_dtype
  // (float16 checkpoints become float32). Stored tensors of F32, BF16 or
  // F16 are converted as needed.
  std::optional<WeightDType> dtype;
};

// Reads `dir`/config.json and the checkpoint's tensors. Every tensor of
// ExpectedTensors(config) must be present with its shape: errors are
// InvalidArgument naming the directory and tensor, e.g.
//   "dir: tensor 'model.layers.0.mlp.up_proj.weight': expected shape
//    [64,32], got [32,64]"
//   "dir: tensor 'model.norm.weight' is missing (expected shape [32])".
// Tolerated extras: "lm_head.weight" when embeddings are tied (some
// exporters write it) and rotary "inv_freq" buffers; any other extra tensor
// is an error (it means the config does not describe the checkpoint).
// Every value loaded must be finite: a tensor holding an Inf or a NaN
// (random bytes, a diverged run) is InvalidArgument naming the file, the
// tensor and the element, e.g.
//   "dir/model.safetensors: tensor 'model.norm.weight' (F32 [32]) holds a
//    non-finite value: element 3 of 32 is NaN; refusing to load ..."
absl::StatusOr<std::shared_ptr<ModelWeights>> LoadHfModel(
    const std::string& dir, const LoadOptions& options = {});

// As LoadHfModel, for a checkpoint already opened and a config already
// parsed (e.g. a staging load of the next policy version). `source` names
// the checkpoint in errors.
absl::StatusOr<std::shared_ptr<ModelWeights>> LoadWeights(
    const ModelConfig& config, const safetensors::ShardedCheckpoint& checkpoint,
    const std::string& source, const LoadOptions& options = {});

// Shard size above which SaveHfModel writes a sharded checkpoint (the
// transformers default max_shard_size).
inline constexpr uint64_t kDefaultMaxShardBytes = 5ull << 30;

struct SaveOptions {
  // Dtype of the stored tensors (and config.json's torch_dtype); default:
  // the weights' dtype.
  std::optional<WeightDType> dtype;
  // One model.safetensors when the tensors fit, else shards of at most this
  // many bytes plus model.safetensors.index.json.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // When non-empty, tokenizer files found there (tokenizer.json,
  // tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt,
  // added_tokens.json, generation_config.json) are copied along.
  std::string tokenizer_dir;
};

// Writes `weights` to `dir` (created if missing): config.json, the
// safetensors file(s) and the tokenizer files. Each file is written
// atomically (see safetensors::WriteFileAtomically); checkpoint files of
// the other layout left from an earlier save into `dir` are removed after
// the new ones are in place, so the directory always loads.
absl::Status SaveHfModel(const ModelWeights& weights, const std::string& dir,
                         const SaveOptions& options = {});

}  // namespace tandem::model
