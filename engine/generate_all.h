#pragma once

// GenerateAll: completes a fixed list of prompts with one Engine driven to
// idle on the caller's thread, for offline callers (held-out evaluation,
// the model tools). The rollout worker does not use it: it feeds its
// engine continuously and streams samples out as they finish.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/engine.h"

namespace tandem::engine {

struct GenerateAllOptions {
  EngineOptions engine;
  // Sampling of every prompt (params.n samples each).
  SamplingParams params;
  // When not empty, one per prompt: prompt i samples with seeds[i] instead
  // of params.seed (its samples with seeds[i] + j, as SamplingParams says).
  std::vector<uint64_t> seeds;
  // When > 0, no sequence grows past this many tokens (prompt + output):
  // each prompt's max_tokens is cut to what is left of it, as a model's
  // position limit requires. A prompt that leaves no room is refused.
  int64_t max_sequence_tokens = 0;
};

// Adds every prompt (request id = its index), steps the engine until it is
// idle, and returns the finished samples ordered by prompt, then sample
// index. `model` is used from this thread only and must outlive the call.
// InvalidArgument names the prompt that cannot be added; model errors come
// back as they are.
absl::StatusOr<std::vector<FinishedSample>> GenerateAll(
    EngineModel* model, absl::Span<const std::vector<int32_t>> prompts,
    const GenerateAllOptions& options);

}  // namespace tandem::engine
