#pragma once

// The coordinator's rules for multi-turn episodes (a lease whose dataset
// row names an environment; docs/environments.md, "Rewards of episodes"):
//
//   - The environment's reward is authoritative. A sample of such a lease
//     carries Sample.environment_reward when the environment gave one, and
//     the coordinator records it as the score without calling a verifier
//     (the verifier cannot in general score a trajectory, and would see
//     the environment's observations, e.g. a calculator's result, in the
//     completion text). An episode that ended without a reward (a limit,
//     the environment failed) scores 0 with outcome = its end reason.
//   - Trust (issue 25): a worker cannot make up rewards. environment_reward
//     and episode_end_reason are refused on a lease without an environment;
//     a reward that is NaN, infinite or outside [environment::kRewardMin,
//     environment::kRewardMax] (common/environment/reward_range.h) is refused; an end reason outside the bounded
//     set is refused, so the outcome label stays bounded.
//   - The score is a function of the sample alone (EpisodeScore), so a
//     coordinator that replays its journal gives the same reward whether or
//     not the Score record survived the crash.

#include <string>

#include "absl/status/status.h"
#include "common/environment/reward_range.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

// True for a known Sample.episode_end_reason.
bool IsEpisodeEndReason(const std::string& reason);

// Request-only checks of samples[index]'s episode fields: the reward finite
// and within environment::kRewardLimit, the end reason known. INVALID_ARGUMENT naming the field
// and value, refusal reason SubmitRefusal::kEpisode.
absl::Status ValidateEpisodeFields(const tandem::v1::Sample& sample, int index);

// The checks that need the lease: on a lease with an environment the end
// reason is required and the reward must be in the task's `range`; on one
// without, neither the reward nor the end reason may be set.
absl::Status ValidateEpisodeForLease(const tandem::v1::Sample& sample,
                                     int index, bool lease_has_environment,
                                     const environment::RewardRange& range);

// The score of an accepted episode sample: its environment reward, or 0
// without one; the outcome is the end reason (a bounded label) and the
// reason its end text.
tandem::v1::Score EpisodeScore(const tandem::v1::Sample& sample);

}  // namespace tandem::coordinator
