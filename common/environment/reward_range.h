#pragma once

// The range of an episode's environment reward. By default [0, 1], the
// range of this package's verifiers and built-in environments; a dataset
// row may give its own ("reward_range": [min, max], e.g. [-1, 1] for an
// environment that penalises), which travels with the lease
// (PromptLease.reward_range). The coordinator refuses a sample whose
// environment reward is outside its task's range; the rollout worker
// checks it before delivering one (from an environment service or from an
// agent harness), since a refused sample's lease could never complete.

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::environment {

inline constexpr double kRewardMin = 0.0;
inline constexpr double kRewardMax = 1.0;

// The largest magnitude a range's ends may have.
inline constexpr double kRewardLimit = 1e6;

struct RewardRange {
  double min = kRewardMin;
  double max = kRewardMax;

  // Finite and in [min, max].
  bool Contains(double reward) const {
    return std::isfinite(reward) && reward >= min && reward <= max;
  }
  // "[-1, 1]".
  std::string ToString() const { return absl::StrCat("[", min, ", ", max, "]"); }
};

// Empty when [min, max] is a usable range (both finite, min < max, each
// within kRewardLimit); otherwise what is wrong, for an error message.
inline std::string RewardRangeError(double min, double max) {
  if (!std::isfinite(min) || !std::isfinite(max)) {
    return "reward_range ends must be finite numbers";
  }
  if (!(min < max)) {
    return absl::StrCat("reward_range [", min, ", ", max,
                        "] must have min < max");
  }
  if (std::fabs(min) > kRewardLimit || std::fabs(max) > kRewardLimit) {
    return absl::StrCat("reward_range [", min, ", ", max,
                        "] must lie within [-",
                        static_cast<int64_t>(kRewardLimit), ", ",
                        static_cast<int64_t>(kRewardLimit), "]");
  }
  return "";
}

}  // namespace tandem::environment
