#include "services/rollout/rollout_metrics.h"

namespace tandem::rollout {

RolloutMetrics::RolloutMetrics(prometheus::Registry& registry)
    : policy_version(prometheus::BuildGauge()
                         .Name("tandem_policy_version")
                         .Help("Policy version of the live weights.")
                         .Register(registry)
                         .Add({})),
      paused(prometheus::BuildGauge()
                 .Name("tandem_rollout_paused")
                 .Help("1 while generation is paused or drained, else 0.")
                 .Register(registry)
                 .Add({})) {}

}  // namespace tandem::rollout
