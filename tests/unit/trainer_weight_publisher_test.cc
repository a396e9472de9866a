// WeightPublisher (the trainer's broadcast and re-send protocol): stopping
// it during a broadcast to a rollout worker that joined the group but never
// takes part interrupts the collective, joins every thread it owns and
// calls nothing back afterwards. On a fake clock, after a broadcast to a
// worker that leaves fails: the wait for the re-send epoch looks at the
// coordinator until exactly its deadline and not after it, and an epoch
// formed at the deadline still gets the version re-sent.

#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "prometheus/registry.h"
#include "services/trainer/weight_publisher.h"
#include "tests/support/fake_clock.h"
#include "tests/support/fake_coordinator_client.h"
#include "tests/support/wait_for.h"
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

// A watch stream that opens and stays open (no events) until `closed`:
// meanwhile the publisher's watcher waits for no time on the clock, and
// the re-send wait's WaitForChange waits 1 s at a time (watching).
// `reading` is notified once the watcher reads, i.e. once it counts as
// watching.
class OpenWatchStream final : public cluster::ClusterEventStream {
 public:
  OpenWatchStream(absl::Notification* reading, absl::Notification* closed)
      : reading_(reading), closed_(closed) {}
  bool WaitUntilOpen() override { return true; }
  bool Read(v1::ClusterEvent*) override {
    if (!reading_->HasBeenNotified()) reading_->Notify();
    closed_->WaitForNotification();
    return false;
  }
  grpc::Status Finish() override {
    return grpc::Status(grpc::StatusCode::CANCELLED, "closed by the test");
  }

 private:
  absl::Notification* const reading_;
  absl::Notification* const closed_;
};

// A publisher on a fake clock with a 60.5 s broadcast timeout (also the
// real-time bound of its Gloo rendezvous and collectives: ample under
// valgrind), a scripted coordinator that records the re-send polls (on the
// clock) and the failure reports, and version 1 in its store. Real-time
// waits are generous for the same reason; they only bound a failure.
struct ResendRig {
  static constexpr absl::Duration kTimeout = absl::Milliseconds(60500);
  static constexpr int kWholeSeconds = 60;
  static constexpr absl::Duration kPatience = absl::Minutes(2);

  testing::FakeClock clock;
  testing::FakeCoordinatorClient coordinator;
  absl::Notification watch_reading;
  absl::Notification watch_closed;
  prometheus::Registry registry;
  weights::WeightSyncMetrics metrics{registry};
  weights::WeightStore store{4};
  weights::StoredPayload full;
  std::unique_ptr<WeightPublisher> publisher;
  std::string store_address;
  uint16_t store_port = 0;

  absl::Mutex mu;
  // Polls answer `failed` until the clock reads `new_epoch_at`, then
  // `next`.
  v1::BroadcastGroup failed, next;
  absl::Time new_epoch_at = absl::InfiniteFuture();
  std::vector<absl::Time> polls ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> failed_epochs ABSL_GUARDED_BY(mu);

  ResendRig() {
    const weights::FlatWeightLayout layout = weights::testing::SmallLayout();
    std::mt19937_64 rng(5);
    weights::WeightBuffer buf(layout.total_bytes());
    weights::testing::FillRandom(layout, &buf, rng);
    full.manifest = *layout.BuildManifest(buf.span(), 1);
    full.manifest.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
    full.bytes = std::make_shared<const std::vector<uint8_t>>(
        buf.data(), buf.data() + layout.total_bytes());
    REQUIRE(store.Put(full.manifest, full.bytes).ok());
    coordinator.on_watch_cluster = [this](const v1::WatchClusterRequest&) {
      return std::make_unique<OpenWatchStream>(&watch_reading, &watch_closed);
    };
    coordinator.on_sync_weight_group =
        [this](const v1::SyncWeightGroupRequest& request,
               v1::SyncWeightGroupResponse* response) {
          absl::MutexLock lock(&mu);
          if (request.failed_epoch() != 0) {
            failed_epochs.push_back(request.failed_epoch());
            return grpc::Status::OK;
          }
          const absl::Time now = clock.Now();
          polls.push_back(now);
          *response->mutable_group() = now >= new_epoch_at ? next : failed;
          return grpc::Status::OK;
        };
    weights::BroadcastSenderOptions options;
    options.timeout = kTimeout;
    auto created = WeightPublisher::Create(options, &store, &metrics, &clock);
    REQUIRE(created.ok());
    publisher = *std::move(created);
    store_address = publisher->store_address();
    store_port = static_cast<uint16_t>(
        std::stoi(store_address.substr(store_address.rfind(':') + 1)));
    failed = Group(1, "test/resend-1");
    next = Group(2, "test/resend-2");
    next.set_first_policy_version(1);
  }

  ~ResendRig() {
    watch_closed.Notify();
    publisher->Stop();
  }

  v1::BroadcastGroup Group(uint64_t epoch, const std::string& prefix) const {
    v1::BroadcastGroup group;
    group.set_epoch(epoch);
    group.set_store_address(store_address);
    group.set_key_prefix(prefix);
    group.add_member_ids("trainer");
    group.add_member_ids("leaving-worker");
    return group;
  }

  // A worker of `group` that joins its rendezvous and leaves at once: the
  // trainer's broadcast to it fails (its connections close).
  std::thread LeavingWorker(const v1::BroadcastGroup& group,
                            absl::Status* joined) {
    return std::thread([this, prefix = group.key_prefix(), joined] {
      auto g = weights::GlooBroadcastGroup::Create(
          weights::testing::GroupConfig(store_port, 1, 2, prefix, kPatience));
      *joined = g.status();
    });
  }

  // Starts the publisher, broadcasts version 1 to `failed` with a worker
  // that leaves, and waits (real time) for the failure report and the
  // re-send wait's first poll.
  void FailFirstBroadcast() {
    publisher->Start(WeightPublisher::Coordinator{
        .client = &coordinator, .member_id = [] { return "trainer"; }});
    REQUIRE(watch_reading.WaitForNotificationWithTimeout(kPatience));
    absl::Status joined;
    std::thread worker = LeavingWorker(failed, &joined);
    weights::PublishedVersion published;
    published.full = full;
    publisher->Broadcast(failed, "trainer", std::move(published));
    worker.join();
    REQUIRE(joined.ok());
    REQUIRE(tandem::testing::WaitFor(
        [&] {
          absl::MutexLock lock(&mu);
          return !polls.empty();
        },
        kPatience));
    absl::MutexLock lock(&mu);
    REQUIRE(failed_epochs == std::vector<uint64_t>{1});
  }

  // Moves the clock in 1 s steps, each once the publisher waits on it,
  // from the failure to 60 s after it (the clock stood still until then);
  // the publisher then waits the last 0.5 s to its deadline.
  void AdvanceWholeSeconds() {
    for (int k = 1; k <= kWholeSeconds; ++k) {
      INFO("second " << k);
      REQUIRE(clock.WaitForWaiters(1, kPatience));
      clock.Advance(absl::Seconds(1));
    }
    REQUIRE(clock.WaitForWaiters(1, kPatience));
  }

  std::vector<absl::Time> Polls() {
    absl::MutexLock lock(&mu);
    return polls;
  }
};

TEST_CASE(
    "WeightPublisher waits for the re-send epoch on its clock until exactly "
    "the broadcast timeout, then gives up",
    "[trainer][weights][gloo]") {
  ResendRig rig;
  const absl::Time failed_at = rig.clock.Now();
  const absl::Time deadline = failed_at + ResendRig::kTimeout;
  rig.FailFirstBroadcast();
  rig.AdvanceWholeSeconds();
  // 1 ms before the deadline it still waits, its last poll 60 s after the
  // failure.
  rig.clock.Advance(absl::Milliseconds(499));
  CHECK(rig.clock.waiters() == 1);
  CHECK(rig.Polls().back() == failed_at + absl::Seconds(60));
  CHECK_FALSE(rig.publisher->WaitIdleForTest(absl::ZeroDuration()));
  // At the deadline: one last look, then it gives up (the sender goes
  // idle with nothing re-sent, and nothing waits on the clock).
  rig.clock.Advance(absl::Milliseconds(1));
  REQUIRE(rig.publisher->WaitIdleForTest(ResendRig::kPatience));
  CHECK(rig.clock.waiters() == 0);
  const std::vector<absl::Time> polls = rig.Polls();
  CHECK(polls.back() == deadline);
  std::set<absl::Time> seconds;  // the distinct times it looked at
  for (const absl::Time t : polls) {
    CHECK(t >= failed_at);
    CHECK(t <= deadline);
    seconds.insert(t);
  }
  CHECK(seconds.size() == 62);  // 0, 1, ..., 60 s and 60.5 s
  absl::MutexLock lock(&rig.mu);
  CHECK(rig.failed_epochs == std::vector<uint64_t>{1});
}

TEST_CASE(
    "WeightPublisher re-sends in an epoch the coordinator forms at the "
    "deadline of its wait",
    "[trainer][weights][gloo]") {
  ResendRig rig;
  const absl::Time deadline = rig.clock.Now() + ResendRig::kTimeout;
  {
    absl::MutexLock lock(&rig.mu);
    rig.new_epoch_at = deadline;
  }
  rig.FailFirstBroadcast();
  // The worker of the new epoch leaves too: the re-send fails in turn and
  // is reported for epoch 2, which shows that it was sent there.
  absl::Status joined;
  std::thread worker = rig.LeavingWorker(rig.next, &joined);
  rig.AdvanceWholeSeconds();
  rig.clock.Advance(absl::Milliseconds(499));
  CHECK(rig.clock.waiters() == 1);
  {
    absl::MutexLock lock(&rig.mu);
    CHECK(rig.failed_epochs == std::vector<uint64_t>{1});
  }
  rig.clock.Advance(absl::Milliseconds(1));
  worker.join();
  REQUIRE(joined.ok());
  CHECK(tandem::testing::WaitFor(
      [&] {
        absl::MutexLock lock(&rig.mu);
        return rig.failed_epochs.size() == 2;
      },
      ResendRig::kPatience));
  absl::MutexLock lock(&rig.mu);
  CHECK(rig.failed_epochs == std::vector<uint64_t>{1, 2});
}

}  // namespace
}  // namespace tandem::trainer
