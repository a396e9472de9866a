// CreateBroadcastGroup (common/weights/broadcast_group.h): the backend of
// the coordinator's BroadcastGroup picks the transport; gloo runs through
// the interface bit for bit, and a backend this member cannot run fails
// at once with FailedPrecondition naming weight_sync.backend. Also the
// BroadcastSender's reaction to such a backend: one report, then broadcast
// off, and every NCCL epoch's receivers told through the store. Ranks are
// threads of this process on loopback.

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/broadcast_sender.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#if TANDEM_ENABLE_NCCL
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#endif
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;

// A CUDA device is visible (the NCCL no-device cases then do not apply).
bool DeviceVisible() {
#if TANDEM_ENABLE_NCCL
  return NcclVisibleDevices().ok();
#else
  return false;
#endif
}

using testing::GroupConfig;

TEST_CASE(
    "CreateBroadcastGroup runs gloo (also for an empty backend) and "
    "delivers versions bit for bit through the interface",
    "[weights][gloo]") {
  const std::string backend = GENERATE(std::string("gloo"), std::string(""));
  INFO("backend '" << backend << "'");
  const FlatWeightLayout layout = testing::SmallLayout();
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  constexpr int kWorld = 3;
  constexpr uint64_t kVersions = 3;
  std::mt19937_64 rng(5);
  std::vector<WeightBuffer> versions;
  for (uint64_t v = 0; v < kVersions; ++v) {
    versions.emplace_back(layout.total_bytes());
    testing::FillRandom(layout, &versions.back(), rng);
  }
  std::vector<absl::Status> results(kWorld);
  std::vector<Bytes> final_bytes(kWorld);
  std::vector<int> ranks(kWorld, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<BroadcastGroup>> group =
          CreateBroadcastGroup(GroupConfig(port, rank, kWorld, "g/epoch1",
                                           absl::Seconds(20), backend),
                               rank == 0 ? server->get() : nullptr);
      if (!group.ok()) {
        results[rank] = group.status();
        return;
      }
      if (dynamic_cast<GlooBroadcastGroup*>(group->get()) == nullptr) {
        results[rank] = absl::InternalError("not a GlooBroadcastGroup");
        return;
      }
      ranks[rank] = (*group)->rank();
      if ((*group)->world_size() != kWorld) {
        results[rank] = absl::InternalError("wrong world size");
        return;
      }
      if (rank == 0) {
        BroadcastWeightSender sender(group->get());
        for (uint64_t v = 0; v < kVersions; ++v) {
          auto m = layout.BuildManifest(versions[v].span(), v);
          if (absl::Status s = sender.Publish(*m, versions[v].span(),
                                              absl::InfiniteFuture());
              !s.ok()) {
            results[rank] = s;
            return;
          }
        }
        return;
      }
      auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
      BroadcastWeightReceiver receiver(group->get());
      for (uint64_t v = 0; v < kVersions; ++v) {
        auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
        if (!got.ok()) {
          results[rank] = got.status();
          return;
        }
        if (*got != v || receiver.last_round_version() != v ||
            !(*staging)->Commit().ok()) {
          results[rank] = absl::InternalError("wrong version or commit");
          return;
        }
      }
      auto live = (*staging)->live();
      final_bytes[rank].assign(live.bytes.begin(), live.bytes.end());
      // Abort through the interface: later collectives fail fast.
      (*group)->Abort();
      if (!(*group)->broken()) {
        results[rank] = absl::InternalError("not broken after Abort()");
        return;
      }
      Bytes one(4);
      if ((*group)->Broadcast(absl::MakeSpan(one)).ok()) {
        results[rank] = absl::InternalError("broadcast after Abort() ran");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO("rank " << rank << ": " << results[rank].ToString());
    REQUIRE(results[rank].ok());
    CHECK(ranks[rank] == rank);
  }
  const Bytes want(versions.back().data(),
                   versions.back().data() + layout.total_bytes());
  for (int rank = 1; rank < kWorld; ++rank) CHECK(final_bytes[rank] == want);
}

TEST_CASE(
    "CreateBroadcastGroup with backend nccl fails at once with "
    "FailedPrecondition naming weight_sync.backend when this member has no "
    "CUDA device or no NCCL",
    "[weights][nccl]") {
  CHECK(BroadcastBackendBuilt("gloo"));
  CHECK(BroadcastBackendBuilt(""));
  CHECK(BroadcastBackendBuilt("nccl") == bool(TANDEM_ENABLE_NCCL));
  CHECK_FALSE(BroadcastBackendBuilt("mpi"));
  if (DeviceVisible()) {
    WARN("skipping: a CUDA device is visible (weights_nccl_test covers it)");
    return;
  }
  // Rank 1 with nobody serving the store: a member that tried a rendezvous
  // would wait the whole timeout; this one must not get that far.
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    BroadcastGroupConfig c =
        GroupConfig(1, rank, 2, "g/epoch2", absl::Seconds(20), "nccl");
    c.timeout = absl::Seconds(30);
    const absl::Time start = absl::Now();
    auto group = CreateBroadcastGroup(c);
    CHECK(absl::Now() - start < absl::Seconds(5));
    REQUIRE_FALSE(group.ok());
    CHECK(absl::IsFailedPrecondition(group.status()));
    const std::string message(group.status().message());
    CHECK_THAT(message, Catch::StartsWith("weight_sync.backend 'nccl': "));
#if TANDEM_ENABLE_NCCL
    CHECK_THAT(message, Catch::Contains("no CUDA device visible"));
#else
    CHECK_THAT(message, Catch::Contains("this build has no NCCL"));
#endif
  }
}

TEST_CASE(
    "CreateBroadcastGroup refuses a backend unknown to this build with "
    "FailedPrecondition naming it",
    "[weights]") {
  auto group = CreateBroadcastGroup(
      GroupConfig(1, 1, 2, "g/epoch3", absl::Seconds(20), "mpi"));
  REQUIRE_FALSE(group.ok());
  CHECK(absl::IsFailedPrecondition(group.status()));
  CHECK_THAT(std::string(group.status().message()),
             Catch::StartsWith("weight_sync.backend 'mpi': unknown to this "
                               "build"));
}

class Outcomes {
 public:
  void Add(const BroadcastOutcome& o) {
    absl::MutexLock lock(&mu_);
    outcomes_.push_back(o);
  }
  std::vector<BroadcastOutcome> Get() {
    absl::MutexLock lock(&mu_);
    return outcomes_;
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

v1::BroadcastGroup Group(uint64_t epoch, const std::string& store,
                         const std::string& backend, int receivers) {
  v1::BroadcastGroup g;
  g.set_epoch(epoch);
  g.set_store_address(store);
  g.set_key_prefix("sender/epoch" + std::to_string(epoch));
  g.set_backend(backend);
  g.set_first_policy_version(epoch);
  g.add_member_ids("trainer");
  for (int i = 0; i < receivers; ++i) {
    g.add_member_ids("w" + std::to_string(i));
  }
  return g;
}

TEST_CASE(
    "BroadcastSender reports a backend it cannot run once, then stops "
    "broadcasting",
    "[weights][nccl]") {
  if (DeviceVisible()) {
    WARN("skipping: a CUDA device is visible");
    return;
  }
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(3);
  Outcomes outcomes;
  BroadcastSenderOptions options;
  options.timeout = absl::Seconds(30);
  auto sender = BroadcastSender::Create(
      options, [&](const BroadcastOutcome& o) { outcomes.Add(o); });
  REQUIRE(sender.ok());
  CHECK((*sender)->unavailable().ok());
  (*sender)->Start();
  const std::string store = (*sender)->store_address();
  const absl::Time start = absl::Now();
  auto enqueue = [&](uint64_t v, const v1::BroadcastGroup& g) {
    WeightBuffer buf(layout.total_bytes());
    testing::FillRandom(layout, &buf, rng);
    v1::WeightManifest m = *layout.BuildManifest(buf.span(), v);
    (*sender)->Enqueue(g, m,
                       std::make_shared<const std::vector<uint8_t>>(
                           buf.data(), buf.data() + layout.total_bytes()));
  };
  enqueue(1, Group(1, store, "nccl", 2));
  const std::vector<BroadcastOutcome> first = outcomes.Wait(1);
  REQUIRE(first.size() == 1);
  CHECK(first[0].version == 1);
  CHECK(absl::IsFailedPrecondition(first[0].status));
  CHECK_THAT(std::string(first[0].status.message()),
             Catch::StartsWith("weight_sync.backend 'nccl': "));
  CHECK_THAT(std::string(first[0].status.message()),
             Catch::Contains("weight broadcast is off for this trainer"));
  // No rendezvous wait: the failure is immediate.
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(absl::IsFailedPrecondition((*sender)->unavailable()));

  // Later epochs (even gloo ones, with receivers that would never come)
  // are dropped without a rendezvous or a report.
  enqueue(2, Group(2, store, "nccl", 1));
  enqueue(3, Group(3, store, "gloo", 1));
  enqueue(4, Group(3, store, "gloo", 1));
  absl::SleepFor(absl::Milliseconds(500));
  (*sender)->Stop();
  CHECK(outcomes.Get().size() == 1);
  CHECK(absl::Now() - start < absl::Seconds(10));

#if TANDEM_ENABLE_NCCL
  // The receivers of both NCCL epochs, waiting for rank 0's ncclUniqueId,
  // find the refusal instead (and would fail at once with its reason).
  c10d::TCPStoreOptions options_client;
  options_client.port =
      static_cast<uint16_t>(std::stoi(store.substr(store.rfind(':') + 1)));
  options_client.isServer = false;
  options_client.timeout = std::chrono::milliseconds(5000);
  auto client =
      c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options_client);
  for (int epoch : {1, 2}) {
    INFO("epoch " << epoch);
    c10d::PrefixStore prefixed("sender/epoch" + std::to_string(epoch), client);
    const std::vector<uint8_t> stored = prefixed.get("nccl_unique_id");
    const absl::Status s = NcclCheckStoredUniqueId(stored);
    CHECK(absl::IsFailedPrecondition(s));
    CHECK_THAT(std::string(s.message()),
               Catch::StartsWith("rank 0 cannot run NCCL: weight_sync.backend "
                                 "'nccl': NCCL weight transport: no CUDA "
                                 "device visible"));
  }
  // Gloo epochs get nothing.
  c10d::PrefixStore gloo_epoch("sender/epoch3", client);
  CHECK_FALSE(gloo_epoch.check({"nccl_unique_id"}));
#endif
}

}  // namespace
}  // namespace tandem::weights
