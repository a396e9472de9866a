// BroadcastSender (the trainer's background broadcaster): one Gloo group per
// membership epoch, receivers as threads of this process.

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/broadcast_sender.h"
#include "common/weights/delta_publisher.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Payload = std::shared_ptr<const std::vector<uint8_t>>;

v1::BroadcastGroup Group(uint64_t epoch, const std::string& store,
                         int receivers) {
  v1::BroadcastGroup g;
  g.set_epoch(epoch);
  g.set_store_address(store);
  g.set_key_prefix("test/epoch" + std::to_string(epoch));
  g.add_member_ids("trainer");
  for (int i = 0; i < receivers; ++i) {
    g.add_member_ids("w" + std::to_string(i));
  }
  return g;
}

struct Version {
  v1::WeightManifest manifest;
  Payload payload;
};

Version MakeVersion(const FlatWeightLayout& layout, uint64_t v,
                    std::mt19937_64& rng) {
  WeightBuffer buf(layout.total_bytes());
  testing::FillRandom(layout, &buf, rng);
  Version out;
  out.manifest = *layout.BuildManifest(buf.span(), v);
  out.manifest.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  out.payload = std::make_shared<const std::vector<uint8_t>>(
      buf.data(), buf.data() + layout.total_bytes());
  return out;
}

// A receiver rank: joins `group` and receives `count` versions, returning
// the bytes of the last one.
struct Receiver {
  absl::Status status;
  std::vector<uint64_t> versions;
  std::vector<uint8_t> last;
};

void Receive(const FlatWeightLayout& layout, uint16_t port,
             const v1::BroadcastGroup& g, int rank, int count,
             absl::Duration timeout, Receiver* out) {
  const GlooGroupConfig c = testing::GroupConfig(
      port, rank, g.member_ids_size(), g.key_prefix(), timeout);
  auto group = GlooBroadcastGroup::Create(c);
  if (!group.ok()) {
    out->status = group.status();
    return;
  }
  auto staging = *StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  GlooWeightReceiver receiver(group->get());
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<uint64_t> v =
        receiver.ReceiveNext(staging.get(), absl::Now() + timeout);
    if (!v.ok()) {
      out->status = v.status();
      return;
    }
    out->versions.push_back(*v);
    REQUIRE(staging->Commit().ok());
  }
  auto live = staging->live().bytes;
  out->last.assign(live.begin(), live.end());
}

class Outcomes {
 public:
  void Add(const BroadcastOutcome& o) {
    absl::MutexLock lock(&mu_);
    outcomes_.push_back(o);
  }
  // Waits until `n` outcomes arrived (or 30 s).
  std::vector<BroadcastOutcome> Wait(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return outcomes_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return outcomes_;
  }

 private:
  absl::Mutex mu_;
  std::vector<BroadcastOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
};

// A started BroadcastSender (rendezvous and collective deadline `timeout`)
// that hands its outcomes to `outcomes`.
std::unique_ptr<BroadcastSender> StartSender(absl::Duration timeout,
                                             Outcomes* outcomes) {
  BroadcastSenderOptions options;
  options.timeout = timeout;
  auto sender = BroadcastSender::Create(
      options, [outcomes](const BroadcastOutcome& o) { outcomes->Add(o); });
  REQUIRE(sender.ok());
  (*sender)->Start();
  return *std::move(sender);
}

uint16_t PortOf(const std::string& store) {
  return static_cast<uint16_t>(std::stoi(store.substr(store.rfind(':') + 1)));
}

TEST_CASE(
    "BroadcastSender delivers each version to the group of its epoch and "
    "forms a new group when the epoch changes",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Outcomes outcomes;
  const std::unique_ptr<BroadcastSender> sender =
      StartSender(absl::Seconds(20), &outcomes);
  const std::string store = sender->store_address();
  const uint16_t port = PortOf(store);
  std::mt19937_64 rng(5);
  std::vector<Version> versions;
  for (uint64_t v = 0; v <= 3; ++v) {
    versions.push_back(MakeVersion(layout, v, rng));
  }

  // Epoch 1: one receiver, versions 1 and 2 (sent one at a time).
  const v1::BroadcastGroup e1 = Group(1, store, 1);
  Receiver r1;
  std::thread t1(
      [&] { Receive(layout, port, e1, 1, 2, absl::Seconds(20), &r1); });
  sender->Enqueue(e1, versions[1].manifest, versions[1].payload);
  outcomes.Wait(1);
  sender->Enqueue(e1, versions[2].manifest, versions[2].payload);
  t1.join();
  REQUIRE(r1.status.ok());
  CHECK(r1.versions == std::vector<uint64_t>{1, 2});
  CHECK(r1.last == *versions[2].payload);

  // Epoch 2: two receivers, a fresh rendezvous under a new key prefix.
  const v1::BroadcastGroup e2 = Group(2, store, 2);
  Receiver a, b;
  std::thread ta(
      [&] { Receive(layout, port, e2, 1, 1, absl::Seconds(20), &a); });
  std::thread tb(
      [&] { Receive(layout, port, e2, 2, 1, absl::Seconds(20), &b); });
  sender->Enqueue(e2, versions[3].manifest, versions[3].payload);
  ta.join();
  tb.join();
  REQUIRE(a.status.ok());
  REQUIRE(b.status.ok());
  CHECK(a.last == *versions[3].payload);
  CHECK(b.last == *versions[3].payload);
  std::vector<BroadcastOutcome> done = outcomes.Wait(3);
  REQUIRE(done.size() == 3);
  for (const BroadcastOutcome& o : done) {
    CHECK(o.status.ok());
    CHECK(o.bytes == layout.total_bytes());
  }
  CHECK(done[2].group.epoch() == 2);
  sender->Stop();
}

TEST_CASE(
    "a receiver that never joins fails the epoch within the deadline; the "
    "sender reports it and drops the epoch's other versions",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Outcomes outcomes;
  const std::unique_ptr<BroadcastSender> sender =
      StartSender(absl::Seconds(1), &outcomes);
  const std::string store = sender->store_address();
  const uint16_t port = PortOf(store);
  std::mt19937_64 rng(6);
  Version first = MakeVersion(layout, 1, rng);
  Version second = MakeVersion(layout, 2, rng);

  // Rank 2 is dead: rank 1 joins, the rendezvous times out for both.
  const v1::BroadcastGroup e1 = Group(1, store, 2);
  Receiver alive;
  const absl::Time start = absl::Now();
  std::thread t(
      [&] { Receive(layout, port, e1, 1, 1, absl::Seconds(1), &alive); });
  sender->Enqueue(e1, first.manifest, first.payload);
  std::vector<BroadcastOutcome> done = outcomes.Wait(1);
  t.join();
  REQUIRE(done.size() == 1);
  CHECK_FALSE(done[0].status.ok());
  CHECK_FALSE(alive.status.ok());
  CHECK(absl::Now() - start < absl::Seconds(15));
  // Later versions of the failed epoch are not attempted: the sender goes
  // idle without a rendezvous or an outcome.
  const uint64_t rendezvous = sender->RendezvousStartedForTest();
  sender->Enqueue(e1, second.manifest, second.payload);
  CHECK(sender->WaitIdleForTest(absl::Seconds(10)));
  CHECK(sender->RendezvousStartedForTest() == rendezvous);
  CHECK(outcomes.Wait(1).size() == 1);
  sender->Stop();
}

TEST_CASE(
    "a broadcast version whose bytes fail the checksum is rejected and not "
    "committable; the group stays usable for the next version",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  std::mt19937_64 rng(7);
  Version bad = MakeVersion(layout, 1, rng);
  // Corrupt one byte of bucket 1 after the manifest was built.
  auto corrupted = std::make_shared<std::vector<uint8_t>>(*bad.payload);
  (*corrupted)[layout.buckets()[1].offset + 5] ^= 0x40;
  bad.payload = corrupted;
  Version good = MakeVersion(layout, 2, rng);

  absl::Status first, second;
  bool ready_after_bad = true;
  uint64_t round_after_bad = 0;
  std::vector<uint8_t> received;
  std::thread receiver([&] {
    const GlooGroupConfig c =
        testing::GroupConfig(port, 1, 2, "corrupt", absl::Seconds(20));
    auto group = GlooBroadcastGroup::Create(c);
    REQUIRE(group.ok());
    auto staging = *StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    GlooWeightReceiver r(group->get());
    first =
        r.ReceiveNext(staging.get(), absl::Now() + absl::Seconds(20)).status();
    ready_after_bad = staging->ready();
    round_after_bad = r.last_round_version();
    second =
        r.ReceiveNext(staging.get(), absl::Now() + absl::Seconds(20)).status();
    if (second.ok()) {
      REQUIRE(staging->Commit().ok());
      auto live = staging->live().bytes;
      received.assign(live.begin(), live.end());
    }
  });
  const GlooGroupConfig c =
      testing::GroupConfig(port, 0, 2, "corrupt", absl::Seconds(20));
  auto group = GlooBroadcastGroup::Create(c, server->get());
  REQUIRE(group.ok());
  GlooWeightSender sender(group->get());
  REQUIRE(
      sender.Publish(bad.manifest, *bad.payload, absl::InfiniteFuture()).ok());
  REQUIRE(sender.Publish(good.manifest, *good.payload, absl::InfiniteFuture())
              .ok());
  receiver.join();
  CHECK(first.code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(ready_after_bad);
  CHECK(round_after_bad == 1);
  CHECK(second.ok());
  CHECK(received == *good.payload);
  CHECK_FALSE((*group)->broken());
}

TEST_CASE(
    "after a failed epoch the re-sent version goes first to the next epoch; "
    "jobs of the failed epoch and a version already sent are dropped",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Outcomes outcomes;
  const std::unique_ptr<BroadcastSender> sender =
      StartSender(absl::Seconds(1), &outcomes);
  const std::string store = sender->store_address();
  std::mt19937_64 rng(8);
  std::vector<Version> versions;
  for (uint64_t v = 0; v <= 3; ++v) {
    versions.push_back(MakeVersion(layout, v, rng));
  }
  // Epoch 1's rank 1 is dead: version 1 fails there.
  sender->Enqueue(Group(1, store, 1), versions[1].manifest,
                  versions[1].payload);
  REQUIRE(outcomes.Wait(1).size() == 1);
  // Epoch 2 (the survivor) gets versions 1 (re-sent) and 2 and 3.
  const v1::BroadcastGroup e2 = Group(2, store, 1);
  Receiver survivor;
  std::thread t([&] {
    Receive(layout, PortOf(store), e2, 1, 3, absl::Seconds(20), &survivor);
  });
  sender->Resend(e2, {versions[1].manifest, versions[1].payload});
  std::vector<BroadcastOutcome> done = outcomes.Wait(2);
  REQUIRE(done.size() == 2);
  CHECK(done[1].status.ok());
  CHECK(done[1].resend);
  CHECK(done[1].version == 1);
  CHECK(done[1].group.epoch() == 2);
  // The publish of version 1 to epoch 2 arriving late, and a job of the
  // failed epoch: neither is sent (the latter would wait out a rendezvous).
  const uint64_t rendezvous = sender->RendezvousStartedForTest();
  const uint64_t collectives = sender->CollectivesStartedForTest();
  sender->Enqueue(e2, versions[1].manifest, versions[1].payload);
  sender->Enqueue(Group(1, store, 1), versions[2].manifest,
                  versions[2].payload);
  CHECK(sender->WaitIdleForTest(absl::Seconds(10)));
  CHECK(sender->RendezvousStartedForTest() == rendezvous);
  CHECK(sender->CollectivesStartedForTest() == collectives);
  CHECK(outcomes.Wait(2).size() == 2);
  sender->Enqueue(e2, versions[2].manifest, versions[2].payload);
  REQUIRE(outcomes.Wait(3).size() == 3);
  sender->Enqueue(e2, versions[3].manifest, versions[3].payload);
  t.join();
  REQUIRE(survivor.status.ok());
  CHECK(survivor.versions == std::vector<uint64_t>{1, 2, 3});
  CHECK(survivor.last == *versions[3].payload);
  done = outcomes.Wait(4);
  REQUIRE(done.size() == 4);
  CHECK(done[3].version == 3);
  CHECK_FALSE(done[3].resend);
  sender->Stop();
}

// A receiver rank that follows epochs `groups` in turn, taking `rounds[i]`
// versions in groups[i]; it does not commit version `drop` (as if it had
// rejected it locally), so it lacks the base of the delta after it.
struct DeltaReceiver {
  std::vector<absl::StatusCode> codes;            // per round
  std::map<uint64_t, std::vector<uint8_t>> live;  // after each commit
  std::vector<bool> delta;                        // per committed version
  absl::Status group_status;
};

void ReceiveEpochs(const FlatWeightLayout& layout, uint16_t port,
                   const std::vector<v1::BroadcastGroup>& groups,
                   const std::vector<int>& rounds, int rank, uint64_t drop,
                   DeltaReceiver* out) {
  auto staging = *StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  for (size_t i = 0; i < groups.size(); ++i) {
    const GlooGroupConfig c =
        testing::GroupConfig(port, rank, groups[i].member_ids_size(),
                             groups[i].key_prefix(), absl::Seconds(20));
    auto group = GlooBroadcastGroup::Create(c);
    if (!group.ok()) {
      out->group_status = group.status();
      return;
    }
    GlooWeightReceiver receiver(group->get());
    for (int r = 0; r < rounds[i]; ++r) {
      absl::StatusOr<uint64_t> v =
          receiver.ReceiveNext(staging.get(), absl::Now() + c.timeout);
      out->codes.push_back(v.status().code());
      if ((*group)->broken()) {
        out->group_status = v.status();
        return;
      }
      if (!v.ok() || *v == drop) continue;
      REQUIRE(staging->Commit().ok());
      auto bytes = staging->live().bytes;
      out->live[*v].assign(bytes.begin(), bytes.end());
      out->delta.push_back(staging->live_manifest()->kind() ==
                           v1::WEIGHT_PAYLOAD_KIND_DELTA);
    }
  }
}

TEST_CASE(
    "bf16 versions broadcast as a full copy then deltas reproduce the "
    "trainer's bytes bit for bit; a coalesced gap, and a receiver without "
    "the base, fall back safely",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Outcomes outcomes;
  absl::Notification release;
  absl::Notification hold_after_4;
  BroadcastSenderOptions options;
  options.timeout = absl::Seconds(20);
  auto sender =
      BroadcastSender::Create(options, [&](const BroadcastOutcome& o) {
        outcomes.Add(o);
        // Hold the sender thread after version 4, so versions 5 and 6 queue
        // up and coalesce.
        if (o.version == 4) {
          hold_after_4.Notify();
          release.WaitForNotification();
        }
      });
  REQUIRE(sender.ok());
  (*sender)->Start();
  const std::string store = (*sender)->store_address();
  auto publisher = DeltaPublisher::Create(
      {.enabled = true, .anchor_every = 1000, .max_density = 0.5});
  REQUIRE(publisher.ok());
  std::mt19937_64 rng(9);
  WeightBuffer current(layout.total_bytes());
  testing::FillRandom(layout, &current, rng);
  std::map<uint64_t, PublishedVersion> published;
  auto publish = [&](uint64_t v) {
    if (v > 1) testing::Perturb(layout, &current, rng, 0.02);
    auto manifest = layout.BuildManifest(current.span(), v);
    REQUIRE(manifest.ok());
    auto p = publisher->Publish(
        *manifest, std::make_shared<const std::vector<uint8_t>>(
                       current.data(), current.data() + current.size()));
    REQUIRE(p.ok());
    published[v] = *p;
    return *p;
  };
  v1::BroadcastGroup e1 = Group(1, store, 2);
  e1.set_first_policy_version(1);
  v1::BroadcastGroup e2 = Group(2, store, 2);
  e2.set_first_policy_version(8);
  // Rounds: 1, 2, 3, 4, 6 (5 coalesced away), 7 in epoch 1; 8 in epoch 2.
  DeltaReceiver a, b;
  std::thread ta([&] {
    ReceiveEpochs(layout, PortOf(store), {e1, e2}, {6, 1}, 1, 0, &a);
  });
  std::thread tb([&] {
    ReceiveEpochs(layout, PortOf(store), {e1, e2}, {6, 1}, 2, 3, &b);
  });
  auto send = [&](const v1::BroadcastGroup& g, uint64_t v) {
    PublishedVersion p = publish(v);
    (*sender)->Enqueue(g, p.full, p.delta);
  };
  for (uint64_t v = 1; v <= 4; ++v) {
    send(e1, v);
    if (v < 4) REQUIRE(outcomes.Wait(v).size() == v);
  }
  hold_after_4.WaitForNotification();
  send(e1, 5);
  send(e1, 6);
  release.Notify();
  REQUIRE(outcomes.Wait(5).size() == 5);
  send(e1, 7);
  REQUIRE(outcomes.Wait(6).size() == 6);
  send(e2, 8);
  std::vector<BroadcastOutcome> done = outcomes.Wait(7);
  ta.join();
  tb.join();
  (*sender)->Stop();
  REQUIRE(done.size() == 7);
  std::vector<uint64_t> versions;
  std::vector<bool> full;
  for (const BroadcastOutcome& o : done) {
    CHECK(o.status.ok());
    versions.push_back(o.version);
    full.push_back(o.full);
    if (!o.full) CHECK(o.bytes < layout.total_bytes() / 4);
  }
  CHECK(versions == std::vector<uint64_t>{1, 2, 3, 4, 6, 7, 8});
  // 1: nothing to delta on; 6: the receivers hold 4, not 5; 8: the first
  // version of epoch 2, whose members got 7 in epoch 1.
  CHECK(full ==
        std::vector<bool>{true, false, false, false, true, false, false});
  REQUIRE(a.group_status.ok());
  REQUIRE(b.group_status.ok());
  for (uint64_t v : {1, 2, 3, 4, 6, 7, 8}) {
    INFO("version " << v);
    REQUIRE(a.live.count(v) == 1);
    CHECK(a.live[v] == *published[v].full.bytes);
  }
  CHECK(a.delta ==
        std::vector<bool>{false, true, true, true, false, true, true});
  // b skipped 3, so the delta of 4 (on 3) was rejected after the
  // collective; the full 6 brought it back, then deltas again.
  CHECK(b.codes[3] == absl::StatusCode::kFailedPrecondition);
  CHECK(b.live.count(4) == 0);
  for (uint64_t v : {6, 7, 8}) {
    INFO("version " << v);
    REQUIRE(b.live.count(v) == 1);
    CHECK(b.live[v] == *published[v].full.bytes);
  }
}

TEST_CASE(
    "Stop during a broadcast to a peer that joined the group but never takes "
    "part interrupts the collective, joins the sender thread and resets the "
    "peer's connections, 20 times",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(9);
  const Version version = MakeVersion(layout, 1, rng);
  // Far beyond the test's timeout: only an abort ends the collective (and
  // the peer's) before the test times out.
  const absl::Duration never = absl::Minutes(10);
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    // On the heap: a listener call after Stop() would read freed memory,
    // which ASan reports (the detached thread of old did).
    auto outcomes = std::make_unique<Outcomes>();
    std::unique_ptr<BroadcastSender> sender =
        StartSender(never, outcomes.get());
    const std::string store = sender->store_address();
    const v1::BroadcastGroup group = Group(round + 1, store, 1);
    absl::Notification joined;
    absl::Notification stopped;
    absl::Status peer_joined;
    absl::Status peer_after_stop;
    std::thread peer([&] {
      auto g = GlooBroadcastGroup::Create(testing::GroupConfig(
          PortOf(store), 1, 2, group.key_prefix(), never));
      peer_joined = g.status();
      joined.Notify();
      stopped.WaitForNotification();
      if (!g.ok()) return;
      // The sender's abort reset this rank's connections: its next
      // collective fails at once instead of at its deadline.
      std::vector<uint8_t> bytes(64);
      peer_after_stop = (*g)->Broadcast(absl::MakeSpan(bytes));
    });
    sender->Enqueue(group, version.manifest, version.payload);
    joined.WaitForNotification();
    if (round % 2 == 1) {
      // Odd rounds stop inside the collective, even ones as the group
      // forms.
      while (sender->CollectivesStartedForTest() == 0) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    sender->Stop();
    stopped.Notify();
    peer.join();
    REQUIRE(peer_joined.ok());
    CHECK_FALSE(peer_after_stop.ok());
    // The interrupted job is reported once, as cancelled by the stop.
    std::vector<BroadcastOutcome> done = outcomes->Wait(1);
    REQUIRE(done.size() == 1);
    CHECK(done[0].status.code() == absl::StatusCode::kCancelled);
    sender.reset();
    outcomes.reset();
  }
}

TEST_CASE(
    "Stop while the group forms and its other member never comes ends the "
    "rendezvous and joins the sender thread, 20 times",
    "[weights][gloo]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(10);
  const Version version = MakeVersion(layout, 1, rng);
  const absl::Duration never = absl::Minutes(10);
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    auto outcomes = std::make_unique<Outcomes>();
    std::unique_ptr<BroadcastSender> sender =
        StartSender(never, outcomes.get());
    // Rank 1 never joins: the rendezvous would wait 10 minutes.
    sender->Enqueue(Group(round + 1, sender->store_address(), 1),
                    version.manifest, version.payload);
    if (round % 2 == 1) {
      // Odd rounds stop inside the rendezvous, even ones whenever.
      while (sender->RendezvousStartedForTest() == 0) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    sender->Stop();
    std::vector<BroadcastOutcome> done = outcomes->Wait(0);
    // Stopped before the job started (nothing to report), or in its
    // rendezvous (reported as cancelled).
    REQUIRE(done.size() <= 1);
    if (round % 2 == 1) REQUIRE(done.size() == 1);
    if (!done.empty()) {
      CHECK(done[0].status.code() == absl::StatusCode::kCancelled);
    }
    sender.reset();
    outcomes.reset();
  }
}

}  // namespace
}  // namespace tandem::weights
