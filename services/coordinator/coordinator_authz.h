#pragma once

// Who may call which Coordinator RPC when the coordinator serves mutual TLS
// (tls.mode: mtls): the one table of RPC -> allowed certificate roles, and
// which of them may only name their own member id. Coordinator::Authorize
// applies it at the top of every handler; with tls.mode off nothing is
// checked. docs/operations.md ("Roles and authorization") shows the same
// table.
//
// The caller's role and name come from its client certificate
// (common/rpc/peer_identity.h). A member id belongs to the identity that
// registered it (MemberRegistry::CheckOwner); RPCs marked own-member
// refuse a member id of another identity with PERMISSION_DENIED, so a
// rollout certificate cannot renew, return or submit for another member's
// leases, nor heartbeat or deregister it.

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/rpc/peer_identity.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

enum class CoordinatorRpc {
  kRegister,
  kHeartbeat,
  kDeregister,
  kLeasePrompts,
  kRenewLeases,
  kReturnLeases,
  kSubmitSamples,
  kPullTrainingBatch,
  kCommitTrainingBatch,
  kReleaseTrainingBatch,
  kPublishPolicyVersion,
  kResumeTraining,
  kWatchCluster,
  kSyncWeightGroup,
  kGetClusterStatus,
};

struct RpcAccess {
  CoordinatorRpc rpc;
  // The method name in tandem.v1.Coordinator.
  const char* name;
  // Roles whose certificates may call it.
  rpc::PeerRoleSet roles;
  // Of `roles`, those that may only name a member id their own identity
  // registered (a non-empty member_id field). Roles in `roles` but not here
  // may name any member (admin on Deregister).
  rpc::PeerRoleSet own_member;
};

// Every RPC of the service, in proto order.
absl::Span<const RpcAccess> CoordinatorAccessTable();
const RpcAccess& AccessOf(CoordinatorRpc rpc);

// Register: the role asked for must be the certificate's role (a trainer
// certificate registers a trainer, never a verifier). PermissionDenied
// naming both otherwise.
absl::Status CheckRegisterRole(tandem::v1::Role requested,
                               const rpc::PeerIdentity& caller);

// Why a call was refused, for tandem_coordinator_auth_refused_total{reason}.
enum class AuthRefusal {
  kUnauthenticated,  // no identity in the client certificate
  kWrongRole,        // the certificate's role may not call the RPC
  kOtherMember,      // the member id belongs to another identity
};
inline constexpr AuthRefusal kAllAuthRefusals[] = {
    AuthRefusal::kUnauthenticated, AuthRefusal::kWrongRole,
    AuthRefusal::kOtherMember};
const char* AuthRefusalLabel(AuthRefusal reason);

}  // namespace tandem::coordinator
