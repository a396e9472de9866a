#pragma once

// Scored groups for GrpoTrainer tests: completions sampled by the rollout
// engine (the workers' code) on given weights, rewarded by the parity of
// their first token.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "services/trainer/rl/grpo_trainer.h"

namespace tandem::trainer::testing {

// Four prompts of different lengths, shared by the GRPO tests.
inline std::vector<std::vector<int32_t>> FourPrompts() {
  return {{2, 5, 7}, {3, 9, 11, 4}, {8, 1}, {6, 6, 6, 20}};
}

struct SampleOptions {
  int n = 4;          // samples per prompt
  uint64_t seed = 1;  // prompt p uses seed + 100 * p
  int32_t max_tokens = 4;
  int32_t max_context = 256;
  // Reward 1 when the first generated token % 2 == rewarded_parity, else 0.
  int rewarded_parity = 0;
  // Sampling temperature of each prompt (1 when empty).
  std::vector<float> temperatures;
};

inline absl::StatusOr<std::vector<ScoredPromptGroup>> SampleScoredGroups(
    std::shared_ptr<model::ModelWeights> weights,
    const std::vector<std::vector<int32_t>>& prompts,
    const SampleOptions& options) {
  auto decoder = std::make_shared<model::DecoderModel>(std::move(weights));
  engine::TorchEngineModel engine_model(decoder, options.max_context);
  engine::Engine engine({}, &engine_model, nullptr, 0);
  for (size_t p = 0; p < prompts.size(); ++p) {
    engine::SamplingParams params;
    params.n = options.n;
    params.max_tokens = options.max_tokens;
    params.seed = options.seed + 100 * p;
    if (p < options.temperatures.size()) {
      params.temperature = options.temperatures[p];
    }
    RETURN_IF_ERROR(engine.Add(std::to_string(p), prompts[p], params));
  }
  while (!engine.idle()) RETURN_IF_ERROR(engine.Step().status());
  std::vector<ScoredPromptGroup> groups(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) groups[p].prompt = prompts[p];
  for (auto& f : engine.TakeFinished()) {
    ScoredCompletion c;
    c.tokens = f.output;
    c.behavior_logprobs = f.logprobs;
    c.reward = f.output[0] % 2 == options.rewarded_parity ? 1.0 : 0.0;
    groups[std::stoi(f.request_id)].completions.push_back(std::move(c));
  }
  return groups;
}

}  // namespace tandem::trainer::testing
