#include "services/coordinator/member_registry.h"

#include <catch2/catch.hpp>

namespace tandem::coordinator {
namespace {

tandem::v1::RegisterRequest Request(tandem::v1::Role role) {
  tandem::v1::RegisterRequest r;
  r.set_role(role);
  r.set_grpc_address("127.0.0.1:1");
  return r;
}

TEST_CASE("a member silent past the timeout is declared dead exactly once") {
  MemberRegistry registry(absl::Seconds(3), "");
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = registry.Register(Request(tandem::v1::ROLE_ROLLOUT), t0);
  auto b = registry.Register(Request(tandem::v1::ROLE_VERIFIER), t0);
  tandem::v1::HeartbeatRequest hb;
  hb.set_member_id(b.member_id());
  REQUIRE(registry.Heartbeat(hb, t0 + absl::Seconds(2)).ok());
  CHECK(registry.ExpireSilent(t0 + absl::Seconds(3)).empty());
  auto expired = registry.ExpireSilent(t0 + absl::Milliseconds(3001));
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].member_id() == a.member_id());
  CHECK(registry.ExpireSilent(t0 + absl::Seconds(4)).empty());
  auto late = registry.ExpireSilent(t0 + absl::Milliseconds(5001));
  REQUIRE(late.size() == 1);
  CHECK(late[0].member_id() == b.member_id());
}

TEST_CASE("a dead member's heartbeat is refused so it registers again") {
  MemberRegistry registry(absl::Seconds(1), "");
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = registry.Register(Request(tandem::v1::ROLE_ROLLOUT), t0);
  registry.ExpireSilent(t0 + absl::Seconds(2));
  tandem::v1::HeartbeatRequest hb;
  hb.set_member_id(a.member_id());
  absl::Status s = registry.Heartbeat(hb, t0 + absl::Seconds(2));
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(s.message()), Catch::Contains(a.member_id()));
  auto again_request = Request(tandem::v1::ROLE_ROLLOUT);
  again_request.set_previous_member_id(a.member_id());
  auto again = registry.Register(again_request, t0 + absl::Seconds(2));
  CHECK(again.member_id() != a.member_id());
  CHECK(again.reregistrations() == 1);
  CHECK(registry.CountAlive()[tandem::v1::ROLE_ROLLOUT] == 1);
}

TEST_CASE(
    "unknown member heartbeat fails and deregistered members are pruned") {
  MemberRegistry registry(absl::Seconds(1), "");
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  tandem::v1::HeartbeatRequest hb;
  hb.set_member_id("rollout-99");
  CHECK(registry.Heartbeat(hb, t0).code() ==
        absl::StatusCode::kFailedPrecondition);
  auto a = registry.Register(Request(tandem::v1::ROLE_TRAINER), t0);
  REQUIRE(registry.Deregister(a.member_id()).ok());
  CHECK(registry.Deregister("nope").code() == absl::StatusCode::kNotFound);
  CHECK(registry.Snapshot().size() == 1);
  registry.Prune(t0 + absl::Seconds(10), absl::Seconds(5));
  CHECK(registry.Snapshot().empty());
}

TEST_CASE("ids carry the incarnation tag, so two starts never share one") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::string tag = NewIncarnationTag();
  CHECK(tag.size() == 8);
  CHECK(NewIncarnationTag() != tag);
  MemberRegistry before(absl::Seconds(1), tag);
  MemberRegistry after(absl::Seconds(1), NewIncarnationTag());
  auto a = before.Register(Request(tandem::v1::ROLE_ROLLOUT), t0);
  auto b = after.Register(Request(tandem::v1::ROLE_ROLLOUT), t0);
  CHECK(a.member_id() == "rollout-" + tag + "-1");
  CHECK(b.member_id() != a.member_id());
}

TEST_CASE(
    "a member id belongs to the certificate identity that registered it") {
  MemberRegistry registry(absl::Seconds(3), "");
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::string dev = "spiffe://tandem/rollout/dev";
  const std::string other = "spiffe://tandem/rollout/other";
  auto a = registry.Register(Request(tandem::v1::ROLE_ROLLOUT), t0, dev);
  CHECK(registry.CheckOwner(a.member_id(), dev).ok());
  absl::Status refused = registry.CheckOwner(a.member_id(), other);
  CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(refused.message()), Catch::Contains(a.member_id()) &&
                                                 Catch::Contains(dev) &&
                                                 Catch::Contains(other));
  // Without TLS (no identity) nothing is checked.
  CHECK(registry.CheckOwner(a.member_id(), "").ok());
  // Pruned members keep their owner: the id cannot be claimed by another.
  REQUIRE(registry.Deregister(a.member_id()).ok());
  registry.Prune(t0 + absl::Hours(1), absl::Seconds(1));
  CHECK(registry.CheckOwner(a.member_id(), other).code() ==
        absl::StatusCode::kPermissionDenied);
}

TEST_CASE("an id never registered here is claimed by its first identity") {
  MemberRegistry registry(absl::Seconds(3), "");
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::string dev = "spiffe://tandem/rollout/dev";
  const std::string other = "spiffe://tandem/rollout/other";
  // A member of an earlier coordinator start, whose leases the journal
  // replayed, submits under its old id: it becomes that identity's.
  CHECK(registry.CheckOwner("rollout-old-1", dev).ok());
  CHECK(registry.CheckOwner("rollout-old-1", dev).ok());
  CHECK(registry.CheckOwner("rollout-old-1", other).code() ==
        absl::StatusCode::kPermissionDenied);
  // Registering again naming it keeps its leases for the same identity...
  auto again_request = Request(tandem::v1::ROLE_ROLLOUT);
  again_request.set_previous_member_id("rollout-old-1");
  auto again = registry.Register(again_request, t0, dev);
  CHECK(registry.LeaseHolders(again.member_id()) ==
        std::vector<std::string>{again.member_id(), "rollout-old-1"});
  // ...but another identity naming it does not inherit them.
  auto thief = registry.Register(again_request, t0, other);
  CHECK(registry.LeaseHolders(thief.member_id()) ==
        std::vector<std::string>{thief.member_id()});
  // Nor does it inherit the leases of another identity's member that died.
  auto stolen_request = Request(tandem::v1::ROLE_ROLLOUT);
  stolen_request.set_previous_member_id(again.member_id());
  registry.ExpireSilent(t0 + absl::Seconds(10));
  auto late = registry.Register(stolen_request, t0 + absl::Seconds(10), other);
  CHECK(registry.LeaseHolders(late.member_id()) ==
        std::vector<std::string>{late.member_id()});
}

TEST_CASE("claims of unregistered ids stop at kMaxClaims") {
  MemberRegistry registry(absl::Seconds(3), "");
  const std::string dev = "spiffe://tandem/rollout/dev";
  for (size_t i = 0; i < MemberRegistry::kMaxClaims; ++i) {
    REQUIRE(registry.CheckOwner("x-" + std::to_string(i), dev).ok());
  }
  CHECK(registry.CheckOwner("x-more", dev).code() ==
        absl::StatusCode::kPermissionDenied);
  // Registered ids are not claims.
  auto a = registry.Register(Request(tandem::v1::ROLE_ROLLOUT),
                             absl::FromUnixSeconds(1000), dev);
  CHECK(registry.CheckOwner(a.member_id(), dev).ok());
}

}  // namespace
}  // namespace tandem::coordinator
