#include "services/coordinator/coordinator_metrics.h"

#include "services/coordinator/member_registry.h"

namespace tandem::coordinator {

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : members_(prometheus::BuildGauge()
                   .Name("tandem_coordinator_members")
                   .Help("Cluster members known to the coordinator, by role "
                         "and state.")
                   .Register(registry)),
      expired_(prometheus::BuildCounter()
                   .Name("tandem_coordinator_members_expired_total")
                   .Help("Members declared dead after missing heartbeats.")
                   .Register(registry)),
      registrations_(prometheus::BuildCounter()
                         .Name("tandem_coordinator_registrations_total")
                         .Help("Successful member registrations, by role.")
                         .Register(registry)),
      policy_version_(&prometheus::BuildGauge()
                           .Name("tandem_policy_version")
                           .Help("Latest policy version this daemon knows.")
                           .Register(registry)
                           .Add({})) {
  for (auto role : {tandem::v1::ROLE_ROLLOUT, tandem::v1::ROLE_VERIFIER,
                    tandem::v1::ROLE_TRAINER}) {
    for (auto state :
         {tandem::v1::MEMBER_STATE_ALIVE, tandem::v1::MEMBER_STATE_DRAINING,
          tandem::v1::MEMBER_STATE_DEAD, tandem::v1::MEMBER_STATE_LEFT}) {
      SetMembers(role, state, 0);
    }
    expired_.Add({{"role", RoleName(role)}});
    registrations_.Add({{"role", RoleName(role)}});
  }
}

void CoordinatorMetrics::SetMembers(tandem::v1::Role role,
                                    tandem::v1::MemberState state,
                                    double count) {
  members_.Add({{"role", RoleName(role)}, {"state", MemberStateName(state)}})
      .Set(count);
}

void CoordinatorMetrics::CountExpired(tandem::v1::Role role) {
  expired_.Add({{"role", RoleName(role)}}).Increment();
}

void CoordinatorMetrics::CountRegistration(tandem::v1::Role role) {
  registrations_.Add({{"role", RoleName(role)}}).Increment();
}

}  // namespace tandem::coordinator
