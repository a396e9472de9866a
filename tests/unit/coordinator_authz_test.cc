// The coordinator's authorization table (coordinator_authz.h): one entry
// per RPC of tandem.v1.Coordinator, in enum order, and the roles the
// design gives each (issue 25: only the trainer trains and publishes, only
// rollout workers lease and submit, read-only status for every role).

#include "services/coordinator/coordinator_authz.h"

#include <google/protobuf/descriptor.h>

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {
namespace {

using rpc::PeerRole;

constexpr PeerRole kRoles[] = {PeerRole::kCoordinator, PeerRole::kTrainer,
                               PeerRole::kRollout, PeerRole::kVerifier,
                               PeerRole::kAdmin};

// "trainer,rollout": the roles of a set, for readable expectations.
std::string Names(rpc::PeerRoleSet set) {
  std::string out;
  for (PeerRole role : kRoles) {
    if (!set.Contains(role)) continue;
    if (!out.empty()) out += ",";
    out += rpc::PeerRoleName(role);
  }
  return out;
}

TEST_CASE("the table has one entry per Coordinator RPC, in enum order") {
  // Through a message of the same file, so that the file's descriptor is
  // linked in and registered.
  const google::protobuf::ServiceDescriptor* service =
      tandem::v1::RegisterRequest::descriptor()->file()->FindServiceByName(
          "Coordinator");
  REQUIRE(service != nullptr);
  const auto table = CoordinatorAccessTable();
  REQUIRE(table.size() == static_cast<size_t>(service->method_count()));
  std::set<std::string> names;
  for (size_t i = 0; i < table.size(); ++i) {
    INFO(table[i].name);
    CHECK(static_cast<size_t>(table[i].rpc) == i);
    CHECK(&AccessOf(table[i].rpc) == &table[i]);
    CHECK(service->FindMethodByName(table[i].name) != nullptr);
    CHECK(names.insert(table[i].name).second);
    CHECK_FALSE(table[i].roles.empty());
  }
}

TEST_CASE("each RPC is open to the roles whose daemons call it") {
  // rpc -> {roles allowed, roles bound to their own member id}
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"Register", {"trainer,rollout,verifier", ""}},
      {"Heartbeat", {"trainer,rollout,verifier", "trainer,rollout,verifier"}},
      {"Deregister",
       {"trainer,rollout,verifier,admin", "trainer,rollout,verifier"}},
      {"LeasePrompts", {"rollout", "rollout"}},
      {"RenewLeases", {"rollout", "rollout"}},
      {"ReturnLeases", {"rollout", "rollout"}},
      {"SubmitSamples", {"rollout", "rollout"}},
      {"PullTrainingBatch", {"trainer", "trainer"}},
      {"CommitTrainingBatch", {"trainer", "trainer"}},
      {"ReleaseTrainingBatch", {"trainer", "trainer"}},
      {"PublishPolicyVersion", {"trainer", "trainer"}},
      {"ResumeTraining", {"trainer", "trainer"}},
      {"WatchCluster", {"coordinator,trainer,rollout,verifier,admin", ""}},
      {"SyncWeightGroup", {"trainer,rollout", "trainer,rollout"}},
      {"GetClusterStatus", {"coordinator,trainer,rollout,verifier,admin", ""}},
  };
  REQUIRE(expected.size() == CoordinatorAccessTable().size());
  for (const RpcAccess& access : CoordinatorAccessTable()) {
    INFO(access.name);
    auto it = expected.find(access.name);
    REQUIRE(it != expected.end());
    CHECK(Names(access.roles) == it->second.first);
    CHECK(Names(access.own_member) == it->second.second);
  }
}

TEST_CASE("a certificate registers only as its own role") {
  const rpc::PeerIdentity trainer =
      *rpc::ParseSpiffeId("spiffe://tandem/trainer/dev");
  CHECK(CheckRegisterRole(tandem::v1::ROLE_TRAINER, trainer).ok());
  absl::Status refused = CheckRegisterRole(tandem::v1::ROLE_VERIFIER, trainer);
  CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
  CHECK(refused.message() ==
        "Register as verifier needs a certificate of that role; the caller "
        "is trainer 'dev' (spiffe://tandem/trainer/dev)");
  CHECK_FALSE(CheckRegisterRole(tandem::v1::ROLE_UNSPECIFIED, trainer).ok());
  const rpc::PeerIdentity admin =
      *rpc::ParseSpiffeId("spiffe://tandem/admin/dev");
  for (auto role : {tandem::v1::ROLE_TRAINER, tandem::v1::ROLE_ROLLOUT,
                    tandem::v1::ROLE_VERIFIER}) {
    CHECK_FALSE(CheckRegisterRole(role, admin).ok());
  }
}

}  // namespace
}  // namespace tandem::coordinator
