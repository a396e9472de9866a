// Peer identities from client certificates (common/rpc/peer_identity.h):
// the SPIFFE IDs `tandemctl certs init` writes parse into role and name,
// anything else is no identity, and role checks name both roles.

#include "common/rpc/peer_identity.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace tandem::rpc {
namespace {

TEST_CASE("the SPIFFE ID certs init writes parses into role and name") {
  for (const char* role :
       {"coordinator", "trainer", "rollout", "verifier", "admin"}) {
    const std::string uri = std::string("spiffe://tandem/") + role + "/dev";
    absl::StatusOr<PeerIdentity> id = ParseSpiffeId(uri);
    REQUIRE(id.ok());
    CHECK(std::string(PeerRoleName(id->role)) == role);
    CHECK(id->name == "dev");
    CHECK(id->trust_domain == "tandem");
    CHECK(id->uri == uri);
  }
  absl::StatusOr<PeerIdentity> id =
      ParseSpiffeId("spiffe://prod.example.org/rollout/node-7_a.b");
  REQUIRE(id.ok());
  CHECK(id->role == PeerRole::kRollout);
  CHECK(id->name == "node-7_a.b");
  CHECK(id->Describe() ==
        "rollout 'node-7_a.b' (spiffe://prod.example.org/rollout/node-7_a.b)");
}

TEST_CASE("SPIFFE IDs of another shape or an unknown role are refused") {
  for (const char* uri : {
           "spiffe://tandem/rollout",           // no name
           "spiffe://tandem/rollout/dev/x",     // three segments
           "spiffe://tandem/tandem/rollout/x",  // extra prefix
           "spiffe://tandem/root/dev",          // unknown role
           "spiffe://tandem/Rollout/dev",       // roles are lower case
           "spiffe:///rollout/dev",             // no trust domain
           "spiffe://tandem//dev",              // empty role
           "spiffe://tandem/rollout/",          // empty name
           "spiffe://tandem/rollout/..",        // dot segment
           "spiffe://tandem/rollout/a%2Fb",     // escapes
           "spiffe://tandem/rollout/dev?x=1",   // query
           "https://tandem/rollout/dev",        // not spiffe
       }) {
    INFO(uri);
    absl::StatusOr<PeerIdentity> id = ParseSpiffeId(uri);
    REQUIRE_FALSE(id.ok());
    CHECK(id.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(id.status().message()), Catch::Contains(uri));
  }
}

TEST_CASE("a certificate's SANs name at most one identity") {
  // DNS names, IPs and other URIs around the SPIFFE ID are ignored; the
  // same ID found twice (two auth-context properties) is one identity.
  absl::StatusOr<PeerIdentity> id = IdentityFromSans(
      {"localhost", "127.0.0.1", "https://example.org/x",
       "spiffe://tandem/trainer/t1", "spiffe://tandem/trainer/t1"});
  REQUIRE(id.ok());
  CHECK(id->role == PeerRole::kTrainer);
  CHECK(id->name == "t1");

  absl::StatusOr<PeerIdentity> none = IdentityFromSans({"localhost"});
  CHECK(none.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK_THAT(std::string(none.status().message()),
             Catch::Contains("no SAN URI"));
  CHECK(IdentityFromSans({}).status().code() ==
        absl::StatusCode::kUnauthenticated);

  absl::StatusOr<PeerIdentity> bad =
      IdentityFromSans({"spiffe://tandem/root/dev"});
  CHECK(bad.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("unknown role 'root'"));

  absl::StatusOr<PeerIdentity> two = IdentityFromSans(
      {"spiffe://tandem/rollout/dev", "spiffe://tandem/trainer/dev"});
  CHECK(two.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK_THAT(std::string(two.status().message()),
             Catch::Contains("2 identities"));
}

TEST_CASE("a role check names the role needed and the role presented") {
  const PeerIdentity caller = *ParseSpiffeId("spiffe://tandem/rollout/dev");
  CHECK(CheckPeerRole("LeasePrompts", {PeerRole::kRollout}, caller).ok());
  CHECK(CheckPeerRole("GetClusterStatus", PeerRoleSet::All(), caller).ok());
  absl::Status refused =
      CheckPeerRole("PublishPolicyVersion", {PeerRole::kTrainer}, caller);
  CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
  CHECK(refused.message() ==
        "PublishPolicyVersion needs the trainer role; the caller is rollout "
        "'dev' (spiffe://tandem/rollout/dev)");
  CHECK(PeerRoleSet({PeerRole::kTrainer, PeerRole::kRollout, PeerRole::kAdmin})
            .ToString() == "trainer, rollout or admin");
  CHECK(PeerRoleSet().ToString() == "no");
  CHECK_FALSE(CheckPeerRole("X", PeerRoleSet(), caller).ok());
}

}  // namespace
}  // namespace tandem::rpc
