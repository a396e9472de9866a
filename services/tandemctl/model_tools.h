#pragma once

// tandemctl's model tools, for checking a checkpoint against other
// implementations:
//   tokenize  text lines in, one JSON array of token ids per line out
//   logprobs  {"tokens":[...]} lines in, {"logprobs":[...]} out: the
//             log-probability of each token after the first given the ones
//             before, under the model (float32 log-softmax)
//   generate  a completion of a prompt through the rollout engine (greedy
//             with temperature 0)
// `model_dir` is a Hugging Face directory (config.json, *.safetensors,
// tokenizer.json); an empty one means the built-in tiny model.

#include <cstdint>
#include <iosfwd>
#include <string>

#include "absl/status/status.h"

namespace tandem::ctl {

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

}  // namespace tandem::ctl
