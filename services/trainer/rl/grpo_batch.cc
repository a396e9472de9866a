#include "services/trainer/rl/grpo_batch.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::trainer {

int64_t ScoredCompletion::trained_tokens() const {
  if (trained.empty()) return static_cast<int64_t>(tokens.size());
  return std::count_if(trained.begin(), trained.end(),
                       [](uint8_t flag) { return flag != 0; });
}

namespace {

// The reward every completion with tokens got, when they all got the same
// one; nullopt when they differ or none has tokens.
std::optional<double> UniformReward(const ScoredPromptGroup& group) {
  std::optional<double> common;
  for (const ScoredCompletion& c : group.completions) {
    if (c.trained_tokens() == 0) continue;
    if (!common) {
      common = c.reward;
    } else if (c.reward != *common) {
      return std::nullopt;
    }
  }
  return common;
}

// Reference guidance (GrpoTrainerOptions::reference_guidance): a group
// with a reference whose completions all got the same reward below
// `reward` gets the reference as one more completion.
bool NeedsReference(const ScoredPromptGroup& group, double reward) {
  if (group.reference.empty()) return false;
  const std::optional<double> common = UniformReward(group);
  return common.has_value() && *common < reward;
}

ScoredCompletion ReferenceCompletion(const ScoredPromptGroup& group,
                                     double reward, uint64_t version) {
  ScoredCompletion reference;
  reference.tokens = group.reference;
  reference.behavior_logprobs.assign(group.reference.size(), 0.0f);
  reference.reward = reward;
  reference.min_policy_version = version;
  reference.from_reference = true;
  return reference;
}

}  // namespace

absl::StatusOr<GrpoBatch> SelectGrpoBatch(
    const std::vector<ScoredPromptGroup>& input_groups,
    const GrpoBatchOptions& options, uint64_t version) {
  GrpoBatch batch;
  // Copied only when a group gets its reference.
  const double reference_reward = options.reference_reward;
  if (options.reference_guidance &&
      std::any_of(input_groups.begin(), input_groups.end(),
                  [reference_reward](const ScoredPromptGroup& group) {
                    return NeedsReference(group, reference_reward);
                  })) {
    batch.guided = input_groups;
    for (ScoredPromptGroup& group : batch.guided) {
      if (!NeedsReference(group, reference_reward)) continue;
      group.completions.push_back(
          ReferenceCompletion(group, reference_reward, version));
      ++batch.guided_groups;
    }
  }
  const std::vector<ScoredPromptGroup>& groups =
      batch.guided.empty() ? input_groups : batch.guided;
  // Groups whose completions (those with tokens) all got the same reward.
  std::vector<bool> uniform(groups.size(), false);
  for (size_t g = 0; g < groups.size(); ++g) {
    // A non-finite reward is never "uniform": it stays in the batch, where
    // the non-finite check below refuses the step.
    const std::optional<double> common = UniformReward(groups[g]);
    uniform[g] = common.has_value() && std::isfinite(*common);
    if (uniform[g]) ++batch.uniform_groups;
  }
  const bool drop_uniform =
      options.drop_uniform_groups &&
      batch.uniform_groups <
          static_cast<int64_t>(std::count_if(
              groups.begin(), groups.end(),
              [](const ScoredPromptGroup& group) {
                return std::any_of(group.completions.begin(),
                                   group.completions.end(),
                                   [](const ScoredCompletion& c) {
                                     return c.trained_tokens() > 0;
                                   });
              }));
  for (size_t g = 0; g < groups.size(); ++g) {
    const ScoredPromptGroup& group = groups[g];
    if (!(std::isfinite(group.temperature) && group.temperature >= 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", g,
                       ": sampling temperature must be finite "
                       "and >= 0, got ",
                       group.temperature));
    }
    if (drop_uniform && uniform[g]) {
      ++batch.dropped_uniform_groups;
      continue;
    }
    for (const ScoredCompletion& c : group.completions) {
      if (c.behavior_logprobs.size() != c.tokens.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group ", g, ": completion has ", c.tokens.size(), " tokens but ",
            c.behavior_logprobs.size(), " behavior log-probs"));
      }
      if (!c.trained.empty() && c.trained.size() != c.tokens.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g, ": completion has ", c.tokens.size(),
                         " tokens but ", c.trained.size(), " trained flags"));
      }
      if (c.trained_tokens() == 0) continue;
      batch.sequences.push_back(
          {&group.prompt, &c,
           static_cast<int64_t>(group.prompt.size() + c.tokens.size()),
           group.temperature > 0.0 ? 1.0 / group.temperature : 1.0});
      batch.rewards.push_back(static_cast<float>(c.reward));
      batch.group_ids.push_back(static_cast<int64_t>(g));
      batch.staleness.push_back(static_cast<int64_t>(version) -
                                static_cast<int64_t>(c.min_policy_version));
      batch.trained_tokens += c.trained_tokens();
    }
  }
  if (batch.sequences.empty()) {
    return absl::InvalidArgumentError("batch has no completion tokens");
  }
  if (!std::all_of(batch.rewards.begin(), batch.rewards.end(),
                   [](float r) { return std::isfinite(r); })) {
    batch.nonfinite_reward = true;
    return std::move(batch);
  }
  // Reward statistics of the whole batch, dropped uniform groups included
  // (what the rollouts scored, not only what was trained on).
  double sum = 0, sum_sq = 0;
  int64_t scored = 0;
  for (const ScoredPromptGroup& group : groups) {
    for (const ScoredCompletion& c : group.completions) {
      if (c.trained_tokens() == 0 || c.from_reference) continue;
      sum += c.reward;
      sum_sq += c.reward * c.reward;
      ++scored;
    }
  }
  batch.reward_mean = sum / static_cast<double>(scored);
  batch.reward_std =
      std::sqrt(std::max(0.0, sum_sq / static_cast<double>(scored) -
                                  batch.reward_mean * batch.reward_mean));
  return std::move(batch);
}

}  // namespace tandem::trainer
