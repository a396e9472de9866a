// The previous data-plane epoch's grace (data_plane_auth.h,
// DataPlaneKeyHolder): after a rotation, data sealed under the previous
// epoch still opens for the grace (a trainer that has not heard of the
// rotation yet), never longer; an older or unknown epoch is refused and
// counted as a decrypt failure; and the previous key only opens, never
// admits: the trainer's raw port refuses a proof of its previous epoch.
// Broadcasts go through the real protocol (PublishOverBroadcast's bytes
// handed to ReceiveOverBroadcast in order); raw pulls through a real
// WeightServerService on a loopback port.

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/weights/broadcast/broadcast_protocol.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/staging_weights.h"
#include "tests/support/fake_clock.h"
#include "tests/support/raw_data_port.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using GraceServer = testing::KeyedVersionServer;
using testing::HolderOf;
using testing::TestKey;
using tandem::testing::FakeClock;

constexpr absl::Duration kGrace = absl::Seconds(2);

TEST_CASE(
    "after a rotation the previous epoch opens for its grace only, older "
    "and unknown epochs never") {
  FakeClock clock;
  DataPlaneKeyHolder holder(&clock);
  const DataPlaneKey k3 = TestKey(3), k4 = TestKey(4), k5 = TestKey(5);
  holder.Set(k3, kGrace);
  // The first key replaces nothing: no grace epoch.
  CHECK_FALSE(holder.grace_epoch().has_value());
  CHECK_FALSE(holder.ForEpoch(2).has_value());

  holder.Set(k4, kGrace);
  REQUIRE(holder.Get().has_value());
  CHECK(holder.Get()->epoch == 4);  // seals and admits with the new one
  REQUIRE(holder.ForEpoch(4).has_value());
  CHECK(holder.ForEpoch(4)->secret == k4.secret);
  REQUIRE(holder.ForEpoch(3).has_value());
  CHECK(holder.ForEpoch(3)->secret == k3.secret);
  CHECK(holder.grace_epoch() == std::optional<uint64_t>(3));
  CHECK_FALSE(holder.ForEpoch(9).has_value());  // unknown

  // The same epoch handed out again (every Register) keeps the grace.
  holder.Set(k4, kGrace);
  CHECK(holder.ForEpoch(3).has_value());

  // Just before the grace ends it still opens; at its end never again.
  clock.Advance(kGrace - absl::Milliseconds(1));
  CHECK(holder.ForEpoch(3).has_value());
  clock.Advance(absl::Milliseconds(1));
  CHECK_FALSE(holder.ForEpoch(3).has_value());
  CHECK_FALSE(holder.grace_epoch().has_value());
  CHECK(holder.ForEpoch(4).has_value());  // the current key has no end

  // Two rotations within a grace: only the one before the current opens.
  holder.Set(k5, kGrace);
  clock.Advance(absl::Milliseconds(500));
  holder.Set(TestKey(6), kGrace);
  CHECK(holder.ForEpoch(5).has_value());
  CHECK_FALSE(holder.ForEpoch(4).has_value());  // older
  CHECK_FALSE(holder.ForEpoch(3).has_value());
}

TEST_CASE("with no grace the replaced key is not kept") {
  DataPlaneKeyHolder holder;
  holder.Set(TestKey(3));
  holder.Set(TestKey(4));
  CHECK_FALSE(holder.ForEpoch(3).has_value());
  CHECK(holder.ForEpoch(4).has_value());
}

TEST_CASE("the grace is twice the coordinator's heartbeat interval") {
  CHECK(DataPlaneKeyGrace(absl::Seconds(1)) == absl::Seconds(2));
  CHECK(DataPlaneKeyGrace(absl::Milliseconds(500)) == absl::Seconds(1));
}

// One FULL version (SmallLayout, random) published by a trainer holding
// `sender` and received by a worker holding `receiver`, through the
// broadcast protocol: every buffer the trainer broadcasts is handed, in
// order, to the worker's matching broadcast.
struct Received {
  absl::StatusOr<uint64_t> version = absl::UnknownError("not run");
  BroadcastSealOutcome seal;
  bool bit_exact = false;
};

Received BroadcastOnce(const DataPlaneKeyHolder& sender,
                       const DataPlaneKeyHolder& receiver) {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightBuffer weights(layout.total_bytes());
  std::mt19937_64 rng(11);
  testing::FillRandom(layout, &weights, rng);
  auto manifest = layout.BuildManifest(weights.span(), 7);
  REQUIRE(manifest.ok());
  std::vector<std::string> wire;
  REQUIRE(PublishOverBroadcast(
              [&](absl::Span<uint8_t> bytes) {
                wire.emplace_back(reinterpret_cast<const char*>(bytes.data()),
                                  bytes.size());
                return absl::OkStatus();
              },
              *manifest, weights.span(), 0, &sender)
              .ok());
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  size_t next = 0;
  uint64_t round = 0;
  Received r;
  r.version = ReceiveOverBroadcast(
      [&](absl::Span<uint8_t> bytes) -> std::function<absl::Status()> {
        REQUIRE(next < wire.size());
        REQUIRE(wire[next].size() == bytes.size());
        std::memcpy(bytes.data(), wire[next].data(), bytes.size());
        ++next;
        return [] { return absl::OkStatus(); };
      },
      [] {}, staging->get(), &round, nullptr, &receiver, &r.seal);
  if (r.version.ok() && (*staging)->Commit().ok()) {
    const auto live = (*staging)->live().bytes;
    r.bit_exact = live.size() == weights.size() &&
                  std::memcmp(live.data(), weights.data(), live.size()) == 0;
  }
  return r;
}

// A broadcast refused because the worker holds no key of its epoch.
void CheckNoKey(const Received& r, const std::string& message) {
  CHECK(absl::IsUnauthenticated(r.version.status()));
  CHECK(r.seal.decrypt_failed);
  CHECK_FALSE(r.bit_exact);
  if (!message.empty()) CHECK(r.version.status().message() == message);
}

TEST_CASE(
    "a broadcast sealed under the previous epoch opens within the grace; "
    "an older, unknown or expired one is refused as a decrypt failure") {
  FakeClock clock;
  const DataPlaneKey k3 = TestKey(3), k4 = TestKey(4), k5 = TestKey(5);
  // The trainer has not heard of the rotation to 4 yet.
  const auto trainer = HolderOf(k3);
  DataPlaneKeyHolder worker(&clock);
  worker.Set(k3, kGrace);
  worker.Set(k4, kGrace);

  Received r = BroadcastOnce(*trainer, worker);
  INFO(r.version.status().ToString());
  CHECK(r.version.ok());
  CHECK(r.seal.sealed);
  CHECK_FALSE(r.seal.decrypt_failed);
  CHECK(r.bit_exact);

  SECTION("past the grace") {
    clock.Advance(kGrace);
    CheckNoKey(BroadcastOnce(*trainer, worker),
               "broadcast: weights v7 is sealed under data-plane epoch 3, "
               "this worker holds epoch 4");
  }
  SECTION("an older epoch (two rotations)") {
    worker.Set(k5, kGrace);
    CheckNoKey(BroadcastOnce(*trainer, worker),
               "broadcast: weights v7 is sealed under data-plane epoch 3, "
               "this worker holds epoch 5 (and epoch 4 in its grace)");
    // The previous epoch still opens.
    r = BroadcastOnce(*HolderOf(k4), worker);
    CHECK(r.version.ok());
    CHECK(r.bit_exact);
  }
  SECTION("an unknown epoch") {
    CheckNoKey(BroadcastOnce(*HolderOf(TestKey(9)), worker), "");
  }
  SECTION("the previous epoch's number with another secret") {
    // Another key that claims epoch 3 (not the coordinator's): its
    // pieces fail their tags.
    r = BroadcastOnce(*HolderOf(TestKey(3)), worker);
    CHECK(absl::IsDataLoss(r.version.status()));
    CHECK(r.seal.decrypt_failed);
    CHECK_FALSE(r.bit_exact);
  }
}

TEST_CASE(
    "a raw pull from a trainer still at the previous epoch is sealed and "
    "opened under it within the grace") {
  FakeClock clock;
  const DataPlaneKey k3 = TestKey(3), k4 = TestKey(4);
  GraceServer s(HolderOf(k3));
  auto worker = std::make_shared<DataPlaneKeyHolder>(&clock);
  worker->Set(k3, kGrace);
  worker->Set(k4, kGrace);
  PullStats stats = s.Pull({.shared_memory = false, .data_plane_key = worker});
  CHECK(stats.raw_streams >= 1);
  CHECK(stats.grpc_streams == 0);
  CHECK(stats.raw_auth_fallbacks == 0);
  CHECK(stats.raw_decrypt_failures == 0);
  CHECK(s.server.service().stats().data_auth_refused == 0);

  // Past the grace the worker answers for epoch 4, which the trainer
  // refuses as stale: the version comes over FetchWeights.
  clock.Advance(kGrace);
  stats = s.Pull({.shared_memory = false, .data_plane_key = worker});
  CHECK(stats.raw_auth_fallbacks >= 1);
  CHECK(stats.raw_streams == 0);
  CHECK(stats.grpc_streams >= 1);
  CHECK(s.server.service().stats().data_auth_refused >= 1);
}

TEST_CASE(
    "the trainer's raw port admits only its current epoch, even within the "
    "grace of the previous one") {
  // A member removed by the rotation holds epoch 3's secret: it gets no
  // raw stream from a trainer that has moved to epoch 4, however recent
  // the move (the previous key only opens what others sealed).
  const DataPlaneKey k3 = TestKey(3);
  auto trainer = std::make_shared<DataPlaneKeyHolder>();
  trainer->Set(k3, absl::Hours(1));
  trainer->Set(TestKey(4), absl::Hours(1));
  REQUIRE(trainer->ForEpoch(3).has_value());
  GraceServer s(trainer);
  const PullStats stats =
      s.Pull({.shared_memory = false, .data_plane_key = HolderOf(k3)});
  CHECK(stats.raw_streams == 0);
  CHECK(stats.grpc_streams >= 1);  // FetchWeights, under mTLS in a cluster
  CHECK(s.server.service().stats().data_auth_refused >= 1);
}

}  // namespace
}  // namespace tandem::weights
