#pragma once

// Which completions one GRPO step trains on, before any tensor exists:
// reference guidance (a group that failed uniformly gets its reference
// completion), uniform groups (dropped with drop_uniform_groups), the
// per-completion checks that name the group at fault, and the batch's
// reward statistics. No LibTorch here: GrpoTrainer::Step runs it first.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::trainer {

// One completion of a group, as the trainer receives it.
struct ScoredCompletion {
  std::vector<int32_t> tokens;
  std::vector<float> behavior_logprobs;  // one per token
  double reward = 0.0;
  // Oldest policy version that produced any of its tokens.
  uint64_t min_policy_version = 0;
  // Multi-turn episodes: per token, 1 when the model produced it (in the
  // loss) and 0 when the environment did (context for the tokens after it,
  // never a loss term, its behavior log-prob ignored). Empty: every token
  // is the model's. Otherwise one per token.
  std::vector<uint8_t> trained;
  // A reference completion added by the trainer (reference_guidance), not
  // sampled by any rollout worker: it has no behavior log-probs (the
  // vector is ignored); the loss takes the policy's own detached log-probs
  // in their place, so its importance ratio is 1 and its term is the
  // advantage-weighted log-likelihood of the reference.
  bool from_reference = false;

  // Tokens in the loss.
  int64_t trained_tokens() const;
};

struct ScoredPromptGroup {
  std::vector<int32_t> prompt;
  std::vector<ScoredCompletion> completions;
  // Softmax temperature the completions were sampled with: the trainer's
  // log-probs of this group are taken at the same temperature, so that they
  // are comparable with the behavior log-probs (the rollout sampler's are
  // log softmax(logits / temperature)). Greedy sampling (0) reports
  // temperature-1 log-probs, so 0 counts as 1. Finite and >= 0.
  double temperature = 1.0;
  // The dataset's reference completion of the prompt (e.g. the built-in
  // task's answer and end token), when the coordinator has one; used by
  // GrpoTrainerOptions::reference_guidance. Empty: none.
  std::vector<int32_t> reference;
};

// One completion to train on, with the group it belongs to.
struct SequenceRef {
  const std::vector<int32_t>* prompt;
  const ScoredCompletion* completion;
  int64_t packed_tokens;   // prompt + completion
  double inv_temperature;  // of the group's sampling
};

struct GrpoBatchOptions {
  // As GrpoTrainerOptions' fields of the same names.
  bool drop_uniform_groups = false;
  bool reference_guidance = false;
  double reference_reward = 1.0;
};

// The completions a step trains on. `sequences` point into the input
// groups, or into `guided` when a group got its reference: the input must
// outlive the batch (moving the batch keeps `guided`'s elements where they
// are).
struct GrpoBatch {
  GrpoBatch() = default;
  // Not copyable: a copy's `sequences` would point into the original.
  GrpoBatch(const GrpoBatch&) = delete;
  GrpoBatch& operator=(const GrpoBatch&) = delete;
  GrpoBatch(GrpoBatch&&) = default;
  GrpoBatch& operator=(GrpoBatch&&) = default;

  std::vector<ScoredPromptGroup> guided;
  std::vector<SequenceRef> sequences;
  // Parallel to `sequences`: the index of its group, its reward.
  std::vector<int64_t> group_ids;
  std::vector<float> rewards;
  // Per trained completion: `version` minus its min_policy_version.
  std::vector<int64_t> staleness;
  int64_t trained_tokens = 0;
  // As GrpoStepStats' fields of the same names.
  int64_t uniform_groups = 0;
  int64_t dropped_uniform_groups = 0;
  int64_t guided_groups = 0;
  // A trained completion's reward is NaN or infinite (its group's
  // advantages would be NaN): the step must not be taken. The reward
  // statistics are then not computed.
  bool nonfinite_reward = false;
  // Over every completion with trained tokens that the rollouts scored
  // (dropped uniform groups included, references not).
  double reward_mean = 0.0;
  double reward_std = 0.0;
};

// The batch of `groups` for a step of the policy at `version`.
// InvalidArgument naming the group when a temperature is not finite and
// >= 0, or a completion's behavior log-probs or trained flags are not one
// per token; InvalidArgument when no completion has a trained token.
absl::StatusOr<GrpoBatch> SelectGrpoBatch(
    const std::vector<ScoredPromptGroup>& groups,
    const GrpoBatchOptions& options, uint64_t version);

}  // namespace tandem::trainer
