#pragma once

// The model tools of tandem-model (services/model_tools/main.cc), for checking
// a checkpoint against other implementations:
//   tokenize  text lines in, one JSON array of token ids per line out
//   logprobs  {"tokens":[...]} lines in, {"logprobs":[...]} out: the
//             log-probability of each token after the first given the ones
//             before, under the model (float32 log-softmax)
//   generate  a completion of a prompt through the rollout engine (greedy
//             with temperature 0)
//   export    the model as loaded, written back through Tandem's checkpoint
//             writer (SaveHfModel), to check that writer against others
// `model_dir` is a Hugging Face directory (config.json, *.safetensors,
// tokenizer.json); an empty one means the built-in tiny model.

#include <cstdint>
#include <iosfwd>
#include <string>

#include "absl/status/status.h"

namespace tandem::model_tools {

absl::Status Tokenize(const std::string& model_dir, std::istream& in,
                      std::ostream& out);
absl::Status LogProbs(const std::string& model_dir, std::istream& in,
                      std::ostream& out);

struct GenerateOptions {
  std::string prompt;
  int32_t max_tokens = 64;
  float temperature = 0.0f;
  uint64_t seed = 1;
};
absl::Status Generate(const std::string& model_dir,
                      const GenerateOptions& options, std::ostream& out);

// Loads `model_dir` (as the other tools do) and writes it to `out_dir`
// (created if missing) with SaveHfModel in the weights' dtype: config.json,
// model.safetensors, and the tokenizer files of `model_dir` (the arithmetic
// tokenizer.json for the built-in model).
absl::Status Export(const std::string& model_dir, const std::string& out_dir);

}  // namespace tandem::model_tools
