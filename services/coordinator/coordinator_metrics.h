#pragma once

// Metric families of the coordinator, declared once. Label sets are bounded:
// role (3 values) and member state (4 values).

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  // Sets tandem_coordinator_members{role,state}.
  void SetMembers(tandem::v1::Role role, tandem::v1::MemberState state,
                  double count);
  void CountExpired(tandem::v1::Role role);
  void CountRegistration(tandem::v1::Role role);
  prometheus::Gauge& policy_version() { return *policy_version_; }

 private:
  prometheus::Family<prometheus::Gauge>& members_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& registrations_;
  prometheus::Gauge* policy_version_;
};

}  // namespace tandem::coordinator
