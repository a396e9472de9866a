#pragma once

// Short lower-case names of roles and member states, for logs, metric
// labels and tables ("rollout", "alive"). The proto's own *_Name() give the
// enum identifiers instead ("ROLE_ROLLOUT").

#include "tandem/v1/common.pb.h"

namespace tandem::cluster {

inline const char* RoleName(tandem::v1::Role role) {
  switch (role) {
    case tandem::v1::ROLE_ROLLOUT:
      return "rollout";
    case tandem::v1::ROLE_VERIFIER:
      return "verifier";
    case tandem::v1::ROLE_TRAINER:
      return "trainer";
    default:
      return "unspecified";
  }
}

inline const char* MemberStateName(tandem::v1::MemberState state) {
  switch (state) {
    case tandem::v1::MEMBER_STATE_ALIVE:
      return "alive";
    case tandem::v1::MEMBER_STATE_DRAINING:
      return "draining";
    case tandem::v1::MEMBER_STATE_DEAD:
      return "dead";
    case tandem::v1::MEMBER_STATE_LEFT:
      return "left";
    default:
      return "unspecified";
  }
}

}  // namespace tandem::cluster
