// Gloo broadcast transport tests: several ranks as threads of this process,
// rendezvous through a TCPStore on an ephemeral port.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/weight_digest.h"
#include "kernels/anchor_policy.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;

using testing::GroupConfig;

// 0 when a TCP connection to ip:port is accepted, else the errno.
int ConnectError(const char* ip, uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, ip, &addr.sin_addr);
  const int rc =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int error = rc == 0 ? 0 : errno;
  close(fd);
  return error;
}

TEST_CASE(
    "The rendezvous store listens only on the host it is given, not on "
    "every interface",
    "[weights][gloo]") {
  // 127.0.0.2 is another address of this machine (all of 127/8 is
  // loopback): LibTorch's own listener would accept there too.
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(5));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  REQUIRE(port != 0);
  CHECK(ConnectError("127.0.0.1", port) == 0);
  CHECK(ConnectError("127.0.0.2", port) == ECONNREFUSED);

  // A host that is not an address of this machine is refused, naming it.
  auto elsewhere =
      GlooRendezvousStore::Create("192.0.2.1", 0, absl::Seconds(5));
  REQUIRE_FALSE(elsewhere.ok());
  CHECK(elsewhere.status().message().find("192.0.2.1") != std::string::npos);
}

TEST_CASE(
    "Gloo broadcast delivers full and delta versions bit for bit to "
    "every receiver, in whole buckets or in pieces, and a corrupted piece "
    "rejects its version",
    "[weights][gloo]") {
  // Buckets are 4096 bytes: 1000-byte pieces leave a short last piece.
  const uint64_t piece_bytes = GENERATE(uint64_t{0}, uint64_t{1000},
                                        uint64_t{4} << 20);
  INFO("piece_bytes " << piece_bytes);
  const FlatWeightLayout layout = testing::SmallLayout();
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  constexpr int kWorld = 3;
  constexpr uint64_t kVersions = 7;

  // Trainer versions, computed up front: anchors every 3, deltas between.
  auto policy = *kernels::AnchorPolicy::Create(3);
  std::mt19937_64 rng(11);
  std::vector<WeightBuffer> versions;
  versions.emplace_back(layout.total_bytes());
  testing::FillRandom(layout, &versions.back(), rng);
  for (uint64_t v = 1; v < kVersions; ++v) {
    versions.emplace_back(layout.total_bytes());
    std::memcpy(versions[v].data(), versions[v - 1].data(),
                layout.total_bytes());
    testing::Perturb(layout, &versions[v], rng, 0.01);
  }

  std::vector<absl::Status> results(kWorld);
  std::vector<Bytes> final_bytes(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      BroadcastGroupConfig config = GroupConfig(
          port, rank, kWorld, absl::StrCat("epoch1-", piece_bytes));
      config.piece_bytes = piece_bytes;
      auto group = GlooBroadcastGroup::Create(
          config, rank == 0 ? server->get() : nullptr);
      if (!group.ok()) {
        results[rank] = group.status();
        return;
      }
      if (rank == 0) {
        GlooWeightSender sender(group->get());
        for (uint64_t v = 0; v < kVersions; ++v) {
          auto m = layout.BuildManifest(versions[v].span(), v);
          m->set_anchor_version(policy.ScheduledAnchorAtOrBefore(v));
          absl::Status s;
          if (policy.IsScheduledAnchor(v)) {
            s = sender.Publish(*m, versions[v].span(), absl::InfiniteFuture());
          } else {
            auto delta = kernels::EncodeBf16Delta(
                kernels::AsWords(versions[v - 1].span()),
                kernels::AsWords(versions[v].span()));
            m->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
            m->set_base_version(v - 1);
            s = sender.Publish(*m, *delta, absl::InfiniteFuture());
          }
          if (!s.ok()) {
            results[rank] = s;
            return;
          }
        }
        // A FULL version whose payload lost a bit after its manifest was
        // built: in the second 1000-byte piece of bucket 1.
        auto m = layout.BuildManifest(versions.back().span(), kVersions);
        std::vector<uint8_t> bad(versions.back().data(),
                                 versions.back().data() + layout.total_bytes());
        bad[layout.buckets()[1].offset + 1500] ^= 0x08;
        results[rank] = sender.Publish(*m, bad, absl::InfiniteFuture());
        return;
      }
      auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
      GlooWeightReceiver receiver(group->get());
      for (uint64_t v = 0; v < kVersions; ++v) {
        auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
        if (!got.ok()) {
          results[rank] = got.status();
          return;
        }
        if (*got != v || !(*staging)->Commit().ok()) {
          results[rank] = absl::InternalError("wrong version or commit");
          return;
        }
      }
      auto bad = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
      if (bad.status().code() != absl::StatusCode::kDataLoss ||
          (*staging)->Commit().ok()) {
        results[rank] = absl::InternalError(absl::StrCat(
            "corrupted version not rejected: ", bad.status().ToString()));
        return;
      }
      auto live = (*staging)->live();
      final_bytes[rank].assign(live.bytes.begin(), live.bytes.end());
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO("rank " << rank << ": " << results[rank].ToString());
    REQUIRE(results[rank].ok());
  }
  const Bytes want(versions.back().data(),
                   versions.back().data() + layout.total_bytes());
  for (int rank = 1; rank < kWorld; ++rank) CHECK(final_bytes[rank] == want);
}

// The digests of the trainer's manifests, as a worker would fetch them
// over gRPC (ManifestDigestSource); here straight from the trainer's side.
class DigestsByVersion : public TrustedDigestSource {
 public:
  explicit DigestsByVersion(std::vector<std::string> sha256)
      : sha256_(std::move(sha256)) {}
  absl::StatusOr<std::string> TrustedSha256(uint64_t version) override {
    if (version >= sha256_.size()) return absl::NotFoundError("no version");
    return sha256_[version];
  }

 private:
  std::vector<std::string> sha256_;
};

TEST_CASE(
    "Over a real Gloo broadcast, a version whose bytes one member finds "
    "altered with matching CRCs is refused there by the SHA-256 and "
    "committed by the untouched member",
    "[weights][gloo][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  constexpr int kWorld = 3;
  // v0 full, v1 a delta on v0, v2 full, v3 full.
  std::mt19937_64 rng(21);
  std::vector<WeightBuffer> versions;
  std::vector<v1::WeightManifest> manifests;
  std::vector<std::string> digests;
  for (uint64_t v = 0; v < 4; ++v) {
    versions.emplace_back(layout.total_bytes());
    if (v == 0) {
      testing::FillRandom(layout, &versions[v], rng);
    } else {
      std::memcpy(versions[v].data(), versions[v - 1].data(),
                  layout.total_bytes());
      testing::Perturb(layout, &versions[v], rng, 0.01);
    }
    auto m = layout.BuildManifest(versions[v].span(), v);
    REQUIRE(m.ok());
    if (v == 1) {
      m->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
      m->set_base_version(0);
    }
    digests.push_back(m->sha256());
    manifests.push_back(*std::move(m));
  }
  DigestsByVersion trusted(digests);

  std::vector<absl::Status> results(kWorld);
  std::vector<std::vector<uint64_t>> committed(kWorld);
  std::vector<uint64_t> mismatches(kWorld, 0);
  std::vector<std::optional<uint64_t>> live_version(kWorld);
  std::vector<bool> live_matches(kWorld, false);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = GlooBroadcastGroup::Create(
          GroupConfig(port, rank, kWorld, "digest-epoch"),
          rank == 0 ? server->get() : nullptr);
      if (!group.ok()) {
        results[rank] = group.status();
        return;
      }
      if (rank == 0) {
        GlooWeightSender sender(group->get());
        for (uint64_t v = 0; v < versions.size(); ++v) {
          absl::Status s;
          if (v == 1) {
            auto delta =
                kernels::EncodeBf16Delta(kernels::AsWords(versions[0].span()),
                                         kernels::AsWords(versions[1].span()));
            s = delta.ok() ? sender.Publish(manifests[v], *delta,
                                            absl::InfiniteFuture())
                           : delta.status();
          } else {
            s = sender.Publish(manifests[v], versions[v].span(),
                               absl::InfiniteFuture());
          }
          if (!s.ok()) {
            results[rank] = s;
            return;
          }
        }
        return;
      }
      auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
      GlooWeightReceiver receiver(group->get());
      receiver.set_trusted_digests(&trusted);
      if (rank == 2) {
        // Rank 2 finds the bytes of v1 (a delta) and v3 (full) altered in
        // flight, with every bucket's CRC-32C still matching.
        (*staging)->SetTamperHookForTest(
            [&layout](uint64_t v, absl::Span<uint8_t> flat) {
              if (v != 1 && v != 3) return;
              const BucketRange& b = layout.buckets()[1];
              testing::FlipKeepingCrc32c(flat.subspan(b.offset, b.size), 100);
            });
      }
      for (uint64_t v = 0; v < versions.size(); ++v) {
        auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
        if (got.ok() && (*staging)->Commit().ok()) {
          committed[rank].push_back(*got);
        } else if (!IsDigestMismatch(got.status())) {
          results[rank] = got.status();
          return;
        }
      }
      mismatches[rank] = (*staging)->stats().digest_mismatches;
      const LiveWeights live = (*staging)->live();
      live_version[rank] = live.version;
      live_matches[rank] =
          live.version.has_value() &&
          std::memcmp(live.bytes.data(), versions[*live.version].data(),
                      live.bytes.size()) == 0;
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO("rank " << rank << ": " << results[rank].ToString());
    REQUIRE(results[rank].ok());
  }
  CHECK(committed[1] == std::vector<uint64_t>{0, 1, 2, 3});
  CHECK(mismatches[1] == 0);
  CHECK(live_version[1] == std::optional<uint64_t>(3));
  CHECK(live_matches[1]);
  // Rank 2: v1 refused; v2 (full) commits; v3 refused, v2 stays live.
  CHECK(committed[2] == std::vector<uint64_t>{0, 2});
  CHECK(mismatches[2] == 2);
  CHECK(live_version[2] == std::optional<uint64_t>(2));
  CHECK(live_matches[2]);
}

TEST_CASE("Gloo collectives end at their deadline when a peer never shows",
          "[weights][gloo]") {
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(5));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  // Rendezvous: rank 1 of 3 never joins.
  const absl::Time start = absl::Now();
  bool other_joined = true;
  std::thread other([&] {
    other_joined =
        GlooBroadcastGroup::Create(
            GroupConfig(port, 2, 3, "dead-rendezvous", absl::Seconds(2)))
            .ok();
  });
  auto group = GlooBroadcastGroup::Create(
      GroupConfig(port, 0, 3, "dead-rendezvous", absl::Seconds(2)),
      server->get());
  other.join();
  CHECK_FALSE(group.ok());
  CHECK_FALSE(other_joined);
  CHECK(absl::Now() - start < absl::Seconds(15));

  // Broadcast: both ranks join, but rank 1 stops taking part.
  std::atomic<bool> receiver_done{false};
  absl::Status sender_status;
  absl::Status receiver_joined;
  std::thread receiver_thread([&] {
    auto g = GlooBroadcastGroup::Create(
        GroupConfig(port, 1, 2, "dead-peer", absl::Seconds(2)));
    receiver_joined = g.status();
    // Joined, then never takes part in a collective.
    while (!receiver_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  auto g0 = GlooBroadcastGroup::Create(
      GroupConfig(port, 0, 2, "dead-peer", absl::Seconds(2)), server->get());
  if (!g0.ok()) {
    receiver_done = true;
    receiver_thread.join();
    FAIL(g0.status().ToString());
  }
  std::vector<float> big(16 << 20);  // 64 MiB: far more than socket buffers
  const absl::Time t0 = absl::Now();
  absl::Status s = (*g0)->Broadcast(
      {reinterpret_cast<uint8_t*>(big.data()), big.size() * 4});
  const absl::Duration took = absl::Now() - t0;
  receiver_done = true;
  receiver_thread.join();
  REQUIRE(receiver_joined.ok());
  INFO(s.ToString());
  CHECK_FALSE(s.ok());
  CHECK(took < absl::Seconds(15));
  CHECK((*g0)->broken());
  CHECK(absl::IsFailedPrecondition(
      (*g0)->Broadcast({reinterpret_cast<uint8_t*>(big.data()), 4})));
}

}  // namespace
}  // namespace tandem::weights
