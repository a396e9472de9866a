#include "kernels/anchor_policy.h"

#include "absl/strings/str_cat.h"

namespace tandem::kernels {

absl::StatusOr<AnchorPolicy> AnchorPolicy::Create(uint64_t anchor_every,
                                                  double max_delta_fraction) {
  if (anchor_every == 0) {
    return absl::InvalidArgumentError("anchor_every must be >= 1, got 0");
  }
  if (!(max_delta_fraction > 0.0 && max_delta_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_delta_fraction must be in (0, 1], got ", max_delta_fraction));
  }
  return AnchorPolicy(anchor_every, max_delta_fraction);
}

bool AnchorPolicy::ShouldPublishFull(uint64_t version, uint64_t delta_bytes,
                                     uint64_t full_bytes) const {
  if (IsScheduledAnchor(version)) return true;
  return static_cast<double>(delta_bytes) >
         max_delta_fraction_ * static_cast<double>(full_bytes);
}

CatchUpPlan AnchorPolicy::PlanCatchUp(std::optional<uint64_t> have,
                                      uint64_t target, uint64_t target_anchor) {
  CatchUpPlan plan;
  plan.target = target;
  if (have.has_value() && *have >= target_anchor && *have <= target) {
    plan.first_delta = *have + 1;
    return plan;
  }
  plan.fetch_full = true;
  plan.full_version = target_anchor;
  plan.first_delta = target_anchor + 1;
  return plan;
}

}  // namespace tandem::kernels
