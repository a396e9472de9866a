// NCCL broadcast transport tests. The error paths without a device run
// everywhere; the GPU tests (ranks as threads of this process, one CUDA
// device each, rendezvous through a TCPStore on an ephemeral port) pass
// with a warning on machines without two CUDA devices.

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;

NcclGroupConfig Config(uint16_t port, int rank, int world, std::string prefix,
                       absl::Duration timeout = absl::Seconds(20)) {
  NcclGroupConfig c;
  c.store_port = port;
  c.rank = rank;
  c.world_size = world;
  c.device = rank;
  c.key_prefix = std::move(prefix);
  c.timeout = timeout;
  // Smaller than a layout bucket, so every bucket goes in several pieces.
  c.bucket_bytes = 1000;
  return c;
}

// Two ranks need two devices: NCCL refuses two ranks of one communicator
// on the same GPU ("Duplicate GPU detected").
bool TwoDevices() {
  absl::StatusOr<int> devices = NcclVisibleDevices();
  if (!devices.ok()) {
    WARN("skipping the GPU part: " << devices.status().ToString());
    return false;
  }
  if (*devices < 2) {
    WARN("skipping the GPU part: " << *devices
                                   << " CUDA device(s), a 2-rank NCCL group "
                                      "needs 2 (NCCL rejects two ranks on one "
                                      "GPU)");
    return false;
  }
  return true;
}

TEST_CASE(
    "NCCL receivers tell a rank 0 refusal from a unique id and from garbage",
    "[weights][nccl]") {
  const std::string refusal = "tandem-refused:no CUDA device visible";
  absl::Status s = NcclCheckStoredUniqueId(
      {reinterpret_cast<const uint8_t*>(refusal.data()), refusal.size()});
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "rank 0 cannot run NCCL: no CUDA device visible");
  const Bytes id(128, 7);  // sizeof(ncclUniqueId)
  CHECK(NcclCheckStoredUniqueId(id).ok());
  const Bytes garbage(5, 7);
  s = NcclCheckStoredUniqueId(garbage);
  CHECK(absl::IsDataLoss(s));
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("has 5 bytes, want 128"));
  // Nobody serves the store: the refusal cannot be stored, and says so.
  NcclGroupConfig c = Config(1, 0, 2, "refuse/epoch1", absl::Seconds(1));
  s = NcclRefuseGroup(c, "because");
  CHECK(absl::IsUnavailable(s));
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("cannot store the refusal"));
}

TEST_CASE("NCCL group creation fails cleanly without a CUDA device",
          "[weights][nccl]") {
  // Bad arguments are reported before any CUDA call.
  NcclGroupConfig bad;
  bad.rank = 2;
  bad.world_size = 2;
  auto g = NcclBroadcastGroup::Create(bad);
  REQUIRE_FALSE(g.ok());
  CHECK(absl::IsInvalidArgument(g.status()));
  CHECK_THAT(std::string(g.status().message()),
             Catch::Contains("rank 2 outside world_size 2"));
  bad.rank = 0;
  bad.bucket_bytes = 0;
  CHECK(absl::IsInvalidArgument(NcclBroadcastGroup::Create(bad).status()));

  absl::StatusOr<int> devices = NcclVisibleDevices();
  if (devices.ok()) {
    WARN("a CUDA device is visible (" << *devices
                                      << "): the no-device path is not tested "
                                         "here");
    return;
  }
  // No device: a clear FailedPrecondition, before the store is contacted
  // (nothing listens on port 1, and the call does not wait for it).
  CHECK(absl::IsFailedPrecondition(devices.status()));
  CHECK_THAT(std::string(devices.status().message()),
             Catch::StartsWith("NCCL weight transport: no CUDA device visible "
                               "(cudaGetDeviceCount: "));
  const absl::Time start = absl::Now();
  auto group =
      NcclBroadcastGroup::Create(Config(1, 0, 2, "nodevice", absl::Seconds(5)));
  REQUIRE_FALSE(group.ok());
  CHECK(absl::IsFailedPrecondition(group.status()));
  CHECK(group.status().message() == devices.status().message());
  CHECK(absl::Now() - start < absl::Seconds(2));
  // Asking again gives the same answer (no sticky CUDA state, no crash).
  CHECK(NcclBroadcastGroup::Create(Config(1, 1, 2, "nodevice")).status() ==
        group.status());
}

TEST_CASE(
    "NCCL broadcast delivers N versions bit for bit and rejects a corrupted "
    "one",
    "[weights][nccl][gpu]") {
  if (!TwoDevices()) return;
  const FlatWeightLayout layout = testing::SmallLayout();
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  constexpr uint64_t kVersions = 6;
  constexpr uint64_t kCorrupted = 3;  // sent with a flipped payload byte

  std::mt19937_64 rng(5);
  std::vector<WeightBuffer> versions;
  versions.emplace_back(layout.total_bytes());
  testing::FillRandom(layout, &versions.back(), rng);
  for (uint64_t v = 1; v < kVersions; ++v) {
    versions.emplace_back(layout.total_bytes());
    std::memcpy(versions[v].data(), versions[v - 1].data(),
                layout.total_bytes());
    testing::Perturb(layout, &versions[v], rng, 0.05);
  }

  absl::Status sender_status;
  std::vector<absl::StatusOr<uint64_t>> received;
  Bytes live_after_corruption, final_bytes;
  std::thread receiver_thread([&] {
    auto group = NcclBroadcastGroup::Create(Config(port, 1, 2, "versions"));
    if (!group.ok()) {
      received.push_back(group.status());
      return;
    }
    auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    NcclWeightReceiver receiver(group->get());
    for (uint64_t v = 0; v < kVersions; ++v) {
      received.push_back(
          receiver.ReceiveNext(staging->get(), absl::InfiniteFuture()));
      if (received.back().ok()) {
        if (!(*staging)->Commit().ok()) return;
      }
      if (v == kCorrupted) {
        auto live = (*staging)->live();
        live_after_corruption.assign(live.bytes.begin(), live.bytes.end());
      }
    }
    auto live = (*staging)->live();
    final_bytes.assign(live.bytes.begin(), live.bytes.end());
  });
  {
    auto group = NcclBroadcastGroup::Create(Config(port, 0, 2, "versions"));
    if (!group.ok()) {
      sender_status = group.status();
    } else {
      NcclWeightSender sender(group->get());
      for (uint64_t v = 0; v < kVersions && sender_status.ok(); ++v) {
        auto m = layout.BuildManifest(versions[v].span(), v);
        REQUIRE(m.ok());
        WeightBuffer payload(layout.total_bytes());
        std::memcpy(payload.data(), versions[v].data(), layout.total_bytes());
        if (v == kCorrupted) payload.data()[layout.total_bytes() / 2] ^= 0x10;
        sender_status =
            sender.Publish(*m, payload.span(), absl::InfiniteFuture());
      }
    }
  }
  receiver_thread.join();
  INFO("sender: " << sender_status.ToString());
  REQUIRE(sender_status.ok());
  REQUIRE(received.size() == kVersions);
  for (uint64_t v = 0; v < kVersions; ++v) {
    INFO("version " << v << ": " << received[v].status().ToString());
    if (v == kCorrupted) {
      CHECK(absl::IsDataLoss(received[v].status()));
    } else {
      REQUIRE(received[v].ok());
      CHECK(*received[v] == v);
    }
  }
  // The corrupted version never went live; the next ones did, bit for bit.
  const Bytes before(versions[kCorrupted - 1].data(),
                     versions[kCorrupted - 1].data() + layout.total_bytes());
  CHECK(live_after_corruption == before);
  const Bytes want(versions.back().data(),
                   versions.back().data() + layout.total_bytes());
  CHECK(final_bytes == want);
}

TEST_CASE("NCCL Abort() from another thread unblocks a waiting rank",
          "[weights][nccl][gpu]") {
  if (!TwoDevices()) return;
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  const absl::Duration timeout = absl::Seconds(30);

  // Both ranks join; rank 0 never broadcasts. Rank 1 waits for a version
  // until another thread aborts its group, long before the deadline.
  std::atomic<bool> receiver_done{false};
  absl::Status sender_joined;
  std::thread sender_thread([&] {
    auto g = NcclBroadcastGroup::Create(Config(port, 0, 2, "abort", timeout));
    sender_joined = g.status();
    while (!receiver_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  auto group = NcclBroadcastGroup::Create(Config(port, 1, 2, "abort", timeout));
  if (!group.ok()) {
    receiver_done = true;
    sender_thread.join();
    FAIL(group.status().ToString());
  }
  const FlatWeightLayout layout = testing::SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  NcclWeightReceiver receiver(group->get());
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    receiver.Cancel();
  });
  const absl::Time start = absl::Now();
  auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
  const absl::Duration took = absl::Now() - start;
  canceller.join();
  receiver_done = true;
  sender_thread.join();
  REQUIRE(sender_joined.ok());
  INFO(got.status().ToString());
  CHECK(absl::IsCancelled(got.status()));
  CHECK(took < absl::Seconds(10));
  CHECK((*group)->broken());
  Bytes b(4);
  CHECK(absl::IsCancelled((*group)->Broadcast(absl::MakeSpan(b))));
}

TEST_CASE("NCCL broadcast ends at its deadline when the peer stops",
          "[weights][nccl][gpu]") {
  if (!TwoDevices()) return;
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  const absl::Duration timeout = absl::Seconds(2);
  std::atomic<bool> sender_done{false};
  absl::Status sender_joined;
  std::thread sender_thread([&] {
    auto g =
        NcclBroadcastGroup::Create(Config(port, 0, 2, "deadline", timeout));
    sender_joined = g.status();
    while (!sender_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  auto group =
      NcclBroadcastGroup::Create(Config(port, 1, 2, "deadline", timeout));
  if (!group.ok()) {
    sender_done = true;
    sender_thread.join();
    FAIL(group.status().ToString());
  }
  Bytes b(4096);
  const absl::Time start = absl::Now();
  absl::Status s = (*group)->Broadcast(absl::MakeSpan(b));
  const absl::Duration took = absl::Now() - start;
  sender_done = true;
  sender_thread.join();
  REQUIRE(sender_joined.ok());
  INFO(s.ToString());
  CHECK(absl::IsDeadlineExceeded(s));
  CHECK(took >= timeout);
  CHECK(took < timeout + absl::Seconds(5));
  CHECK((*group)->broken());
  CHECK(absl::IsFailedPrecondition((*group)->Broadcast(absl::MakeSpan(b))));
}

}  // namespace
}  // namespace tandem::weights
