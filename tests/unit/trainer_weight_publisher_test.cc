// WeightPublisher (the trainer's broadcast and re-send protocol): stopping
// it during a broadcast to a rollout worker that joined the group but never
// takes part interrupts the collective, joins every thread it owns and
// calls nothing back afterwards.

#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "prometheus/registry.h"
#include "services/trainer/weight_publisher.h"
#include "tests/support/fake_coordinator_client.h"
#include "weights_test_util.h"

namespace tandem::trainer {
namespace {

TEST_CASE(
    "WeightPublisher::Stop during a broadcast to a member that never takes "
    "part aborts it within the drain and joins its threads, 20 times",
    "[trainer][weights][gloo]") {
  const weights::FlatWeightLayout layout = weights::testing::SmallLayout();
  std::mt19937_64 rng(11);
  weights::WeightBuffer buf(layout.total_bytes());
  weights::testing::FillRandom(layout, &buf, rng);
  weights::StoredPayload full;
  full.manifest = *layout.BuildManifest(buf.span(), 1);
  full.manifest.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  full.bytes = std::make_shared<const std::vector<uint8_t>>(
      buf.data(), buf.data() + layout.total_bytes());
  // A coordinator that answers nothing (every call UNIMPLEMENTED): the
  // stopped broadcast must not need it (and the watch stream just
  // retries).
  tandem::testing::FakeCoordinatorClient coordinator;
  // Far beyond the test's timeout: only an abort ends the collective.
  const absl::Duration never = absl::Minutes(10);
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    // What the publisher's callbacks use lives on the heap and goes right
    // after the publisher: a callback after Stop() is a use after free
    // (ASan), as the trainer's was when a detached sender thread outlived
    // Trainer::Stop.
    auto registry = std::make_unique<prometheus::Registry>();
    auto metrics = std::make_unique<weights::WeightSyncMetrics>(*registry);
    auto store = std::make_unique<weights::WeightStore>(4);
    weights::BroadcastSenderOptions options;
    options.timeout = never;
    auto publisher =
        WeightPublisher::Create(options, store.get(), metrics.get());
    REQUIRE(publisher.ok());
    (*publisher)->Start(WeightPublisher::Coordinator{
        .client = &coordinator, .member_id = [] { return "trainer"; }});
    const std::string address = (*publisher)->store_address();
    const uint16_t port = static_cast<uint16_t>(
        std::stoi(address.substr(address.rfind(':') + 1)));

    v1::BroadcastGroup group;
    group.set_epoch(round + 1);
    group.set_store_address(address);
    group.set_key_prefix("test/publisher" + std::to_string(round));
    group.add_member_ids("trainer");
    group.add_member_ids("frozen-worker");

    absl::Notification joined;
    absl::Notification stopped;
    absl::Status peer_joined;
    absl::Status peer_after_stop;
    std::thread peer([&] {
      auto g = weights::GlooBroadcastGroup::Create(weights::testing::GroupConfig(
          port, 1, 2, group.key_prefix(), never));
      peer_joined = g.status();
      joined.Notify();
      stopped.WaitForNotification();
      if (!g.ok()) return;
      std::vector<uint8_t> bytes(64);
      peer_after_stop = (*g)->Broadcast(absl::MakeSpan(bytes));
    });
    weights::PublishedVersion published;
    published.full = full;
    (*publisher)->Broadcast(group, "trainer", std::move(published));
    joined.WaitForNotification();
    // The drain (what GracefulStop leaves of drain_timeout_ms) passes
    // with the collective still blocked; then it is aborted.
    (*publisher)->Stop(absl::Milliseconds(round % 2 == 0 ? 0 : 50));
    stopped.Notify();
    peer.join();
    REQUIRE(peer_joined.ok());
    // The worker's connections were reset: its collective fails at once.
    CHECK_FALSE(peer_after_stop.ok());
    publisher->reset();
    store.reset();
    metrics.reset();
    registry.reset();
  }
}

}  // namespace
}  // namespace tandem::trainer
