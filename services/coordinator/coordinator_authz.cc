#include "services/coordinator/coordinator_authz.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/cluster/member_names.h"
#include "common/rpc/grpc_client.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/request_limits.h"

namespace tandem::coordinator {
namespace {

using rpc::PeerRole;
using rpc::PeerRoleSet;

constexpr PeerRoleSet kNone{};
constexpr PeerRoleSet kTrainer{PeerRole::kTrainer};
constexpr PeerRoleSet kRollout{PeerRole::kRollout};
constexpr PeerRoleSet kMembers{PeerRole::kTrainer, PeerRole::kRollout,
                               PeerRole::kVerifier};
constexpr PeerRoleSet kWeightGroup{PeerRole::kTrainer, PeerRole::kRollout};
constexpr PeerRoleSet kAnyone = PeerRoleSet::All();

// The table. Read-only calls (GetClusterStatus, WatchCluster, whose
// member_id only selects NOT_FOUND for a dead member) are open to every
// role the CA issued; everything that changes state belongs to the role
// whose daemon does it, and names only members of the caller's identity.
constexpr RpcAccess kTable[] = {
    {CoordinatorRpc::kRegister, "Register", kMembers, kNone},
    {CoordinatorRpc::kHeartbeat, "Heartbeat", kMembers, kMembers},
    {CoordinatorRpc::kDeregister,
     "Deregister",
     {PeerRole::kTrainer, PeerRole::kRollout, PeerRole::kVerifier,
      PeerRole::kAdmin},
     kMembers},
    {CoordinatorRpc::kLeasePrompts, "LeasePrompts", kRollout, kRollout},
    {CoordinatorRpc::kRenewLeases, "RenewLeases", kRollout, kRollout},
    {CoordinatorRpc::kReturnLeases, "ReturnLeases", kRollout, kRollout},
    {CoordinatorRpc::kSubmitSamples, "SubmitSamples", kRollout, kRollout},
    {CoordinatorRpc::kPullTrainingBatch, "PullTrainingBatch", kTrainer,
     kTrainer},
    {CoordinatorRpc::kCommitTrainingBatch, "CommitTrainingBatch", kTrainer,
     kTrainer},
    {CoordinatorRpc::kReleaseTrainingBatch, "ReleaseTrainingBatch", kTrainer,
     kTrainer},
    {CoordinatorRpc::kPublishPolicyVersion, "PublishPolicyVersion", kTrainer,
     kTrainer},
    {CoordinatorRpc::kResumeTraining, "ResumeTraining", kTrainer, kTrainer},
    {CoordinatorRpc::kWatchCluster, "WatchCluster", kAnyone, kNone},
    {CoordinatorRpc::kSyncWeightGroup, "SyncWeightGroup", kWeightGroup,
     kWeightGroup},
    {CoordinatorRpc::kGetClusterStatus, "GetClusterStatus", kAnyone, kNone},
};

// The certificate role that registers as each member role.
bool RoleMatches(tandem::v1::Role requested, PeerRole role) {
  switch (requested) {
    case tandem::v1::ROLE_TRAINER:
      return role == PeerRole::kTrainer;
    case tandem::v1::ROLE_ROLLOUT:
      return role == PeerRole::kRollout;
    case tandem::v1::ROLE_VERIFIER:
      return role == PeerRole::kVerifier;
    default:
      return false;
  }
}

}  // namespace

absl::Span<const RpcAccess> CoordinatorAccessTable() { return kTable; }

const RpcAccess& AccessOf(CoordinatorRpc rpc) {
  // kTable is in enum order (coordinator_authz_test checks it).
  return kTable[static_cast<size_t>(rpc)];
}

absl::Status CheckRegisterRole(tandem::v1::Role requested,
                               const rpc::PeerIdentity& caller) {
  if (RoleMatches(requested, caller.role)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "Register as ", cluster::RoleName(requested),
      " needs a certificate of that role; the caller is ", caller.Describe()));
}

const char* AuthRefusalLabel(AuthRefusal reason) {
  switch (reason) {
    case AuthRefusal::kUnauthenticated:
      return "unauthenticated";
    case AuthRefusal::kWrongRole:
      return "wrong_role";
    case AuthRefusal::kOtherMember:
      return "other_member";
  }
  return "?";
}

grpc::Status Coordinator::Authorize(CoordinatorRpc method,
                                    const grpc::ServerContextBase& context,
                                    const std::string& member_id,
                                    std::string* owner,
                                    tandem::v1::Role register_as) {
  if (owner != nullptr) owner->clear();
  if (!config_.server.tls.enabled()) return grpc::Status::OK;
  const RpcAccess& access = AccessOf(method);
  auto refuse = [&](AuthRefusal reason, const absl::Status& status) {
    metrics_.CountAuthRefusal(reason);
    ComponentLogger("coordinator")
        ->warn("refused {} from {} ({}): {}", access.name, context.peer(),
               AuthRefusalLabel(reason), std::string(status.message()));
    return rpc::ToGrpcStatus(status);
  };
  absl::StatusOr<rpc::PeerIdentity> caller =
      rpc::AuthorizedPeerOf(context, access.name, access.roles);
  if (!caller.ok()) {
    return refuse(caller.status().code() == absl::StatusCode::kUnauthenticated
                      ? AuthRefusal::kUnauthenticated
                      : AuthRefusal::kWrongRole,
                  caller.status());
  }
  if (method == CoordinatorRpc::kRegister) {
    if (absl::Status s = CheckRegisterRole(register_as, *caller); !s.ok()) {
      return refuse(AuthRefusal::kWrongRole, s);
    }
  }
  // An oversized id is refused by the size limits after this check; it is
  // never claimed.
  if (!member_id.empty() && member_id.size() <= kMaxIdBytes &&
      access.own_member.Contains(caller->role)) {
    if (absl::Status s = members_.CheckOwner(member_id, caller->uri); !s.ok()) {
      return refuse(AuthRefusal::kOtherMember,
                    absl::PermissionDeniedError(
                        absl::StrCat(access.name, ": ", s.message())));
    }
  }
  if (owner != nullptr) *owner = caller->uri;
  return grpc::Status::OK;
}

grpc::Status Coordinator::Admit(CoordinatorRpc method,
                                const grpc::ServerContextBase& context,
                                const std::string& member_id,
                                const google::protobuf::Message& request,
                                std::string* owner,
                                tandem::v1::Role register_as) {
  if (grpc::Status auth =
          Authorize(method, context, member_id, owner, register_as);
      !auth.ok()) {
    return auth;
  }
  return CheckLimits(AccessOf(method).name, request);
}

}  // namespace tandem::coordinator
