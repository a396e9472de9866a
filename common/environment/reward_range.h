#pragma once

// The reward range of an episode's environment reward, for every task: the
// range of this package's verifiers and built-in environments. The
// coordinator refuses a sample whose environment reward is outside it; the
// rollout worker checks it before delivering one (from an environment
// service or from an agent harness), since a refused sample's lease could
// never complete. Not configurable per task yet (issue 23).

#include <cmath>

namespace tandem::environment {

inline constexpr double kRewardMin = 0.0;
inline constexpr double kRewardMax = 1.0;

// Finite and in [kRewardMin, kRewardMax].
inline bool IsValidReward(double reward) {
  return std::isfinite(reward) && reward >= kRewardMin && reward <= kRewardMax;
}

}  // namespace tandem::environment
