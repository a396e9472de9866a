#pragma once

// Prompt sources of the coordinator: the built-in arithmetic task (an
// unbounded seeded stream) and JSONL datasets (epochs with seeded
// shuffling, see jsonl_dataset.h). A source hands out prompts in a
// deterministic order given its configuration; its cursor is the number of
// prompts handed out so far, so a restarted coordinator can skip ahead.
//
// Thread safety: not thread-safe; the caller (the GroupLedger) serializes
// calls.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/environment/reward_range.h"
#include "services/coordinator/coordinator_config.h"

namespace tandem::coordinator {

// One prompt as the coordinator leases it.
struct Prompt {
  // Dataset id; unique within one epoch. For repeated epochs the source
  // appends "@<epoch>" from the second epoch on.
  std::string id;
  std::string text;
  std::vector<int32_t> token_ids;
  // Verifier name and its inputs (e.g. "answer").
  std::string verifier;
  std::map<std::string, std::string> metadata;
  // Multi-turn tasks: the environment that runs the episodes (empty:
  // single-turn). The environment's reward is the score (episode_rules.h).
  std::string environment;
  // Multi-turn tasks: the range the environment's reward must be in.
  environment::RewardRange reward_range;
  // The dataset's reference completion (token ids), if it has one: the
  // built-in task's answer and end token; a JSONL line's
  // reference_completion. Handed to the trainer with the scored group
  // (training.guide_failed_groups).
  std::vector<int32_t> reference_completion_ids;
};

class PromptSource {
 public:
  virtual ~PromptSource() = default;
  // The next prompt, or nullopt when the source is exhausted.
  virtual std::optional<Prompt> Next() = 0;
  // Prompts handed out so far (across epochs).
  virtual uint64_t cursor() const = 0;
  // Human-readable description for logs ("builtin_arith digits=3").
  virtual std::string Describe() const = 0;
  // Stop-token ids the rollout workers should honour for this source.
  virtual std::vector<int32_t> stop_token_ids() const { return {}; }
  // Default max_tokens for the source's prompts.
  virtual int32_t default_max_tokens() const { return 256; }
};

// The built-in arithmetic task's train split, tokenized with its character
// tokenizer; verifier "arith" with metadata answer and end_marker.
absl::StatusOr<std::unique_ptr<PromptSource>> NewArithPromptSource(
    const DatasetOptions& options);

// The source that `options.kind` names. Errors name the file and line.
absl::StatusOr<std::unique_ptr<PromptSource>> NewPromptSource(
    const DatasetOptions& options);

}  // namespace tandem::coordinator
