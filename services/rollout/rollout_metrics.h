#pragma once

// Metric families of the rollout worker, declared once.

#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem::rollout {

struct RolloutMetrics {
  explicit RolloutMetrics(prometheus::Registry& registry);
  // tandem_policy_version: version of the live weights.
  prometheus::Gauge& policy_version;
  // tandem_rollout_paused: 1 while paused or drained.
  prometheus::Gauge& paused;
};

}  // namespace tandem::rollout
