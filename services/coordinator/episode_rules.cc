#include "services/coordinator/episode_rules.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/environment/reward_range.h"
#include "services/coordinator/sample_validation.h"

namespace tandem::coordinator {
namespace {

// The environment's end reasons (tandem.v1.EpisodeEndReason, by their
// metric labels) and the rollout worker's (services/rollout/
// episode_driver.h). "aborted" is not here: an aborted episode goes back
// with its lease, it is never submitted.
constexpr const char* kEndReasons[] = {
    "answered",          "environment", "max_turns",  "observation_too_large",
    "timeout",           "error",       "turn_limit", "token_limit",
    "environment_failed"};

absl::Status Invalid(std::string message) {
  return Refuse(SubmitRefusal::kEpisode, absl::StatusCode::kInvalidArgument,
                std::move(message));
}

}  // namespace

bool IsEpisodeEndReason(const std::string& reason) {
  for (const char* known : kEndReasons) {
    if (reason == known) return true;
  }
  return false;
}

absl::Status ValidateEpisodeFields(const tandem::v1::Sample& sample,
                                   int index) {
  if (sample.has_environment_reward()) {
    const double reward = sample.environment_reward();
    if (!std::isfinite(reward) ||
        std::fabs(reward) > environment::kRewardLimit) {
      return Invalid(absl::StrCat(
          "samples[", index, "].environment_reward is ", reward,
          "; an environment's reward must be finite and within [-",
          static_cast<int64_t>(environment::kRewardLimit), ", ",
          static_cast<int64_t>(environment::kRewardLimit), "]"));
    }
  }
  if (!sample.episode_end_reason().empty() &&
      !IsEpisodeEndReason(sample.episode_end_reason())) {
    // Bounded: the label is echoed only after this check passed.
    const std::string shown = sample.episode_end_reason().substr(0, 64);
    return Invalid(absl::StrCat(
        "samples[", index, "].episode_end_reason is '", shown,
        "', not a known end reason (answered, environment, max_turns, "
        "observation_too_large, timeout, error, turn_limit, token_limit, "
        "environment_failed)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEpisodeForLease(const tandem::v1::Sample& sample,
                                     int index, bool lease_has_environment,
                                     const environment::RewardRange& range) {
  if (lease_has_environment) {
    if (sample.has_environment_reward() &&
        !range.Contains(sample.environment_reward())) {
      return Invalid(absl::StrCat(
          "samples[", index, "].environment_reward is ",
          sample.environment_reward(), "; lease '", sample.lease_id(),
          "' takes rewards in ", range.ToString(),
          " (the dataset row's reward_range, default [0, 1])"));
    }
    if (sample.episode_end_reason().empty()) {
      return Invalid(absl::StrCat(
          "samples[", index, "].episode_end_reason is empty; lease '",
          sample.lease_id(),
          "' names an environment, so its samples are episodes and say "
          "why they ended"));
    }
    return absl::OkStatus();
  }
  if (sample.has_environment_reward()) {
    return Invalid(absl::StrCat(
        "samples[", index, "].environment_reward is ",
        sample.environment_reward(), " but lease '", sample.lease_id(),
        "' names no environment: its samples are scored by the verifier, "
        "a rollout worker cannot give them a reward"));
  }
  if (!sample.episode_end_reason().empty()) {
    return Invalid(absl::StrCat("samples[", index, "].episode_end_reason is '",
                                sample.episode_end_reason(), "' but lease '",
                                sample.lease_id(), "' names no environment"));
  }
  return absl::OkStatus();
}

tandem::v1::Score EpisodeScore(const tandem::v1::Sample& sample) {
  tandem::v1::Score score;
  score.set_reward(sample.has_environment_reward() ? sample.environment_reward()
                                                   : 0.0);
  score.set_outcome(sample.episode_end_reason());
  score.set_reason(sample.has_environment_reward()
                       ? absl::StrCat("the environment's reward (",
                                      sample.episode_end_reason(),
                                      "): ", sample.episode_end_text())
                       : absl::StrCat("the episode ended without a reward (",
                                      sample.episode_end_reason(),
                                      "): ", sample.episode_end_text()));
  return score;
}

}  // namespace tandem::coordinator
