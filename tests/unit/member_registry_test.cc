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

}  // namespace
}  // namespace tandem::coordinator
