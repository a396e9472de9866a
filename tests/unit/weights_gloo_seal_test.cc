// Sealed broadcast over a real Gloo group (broadcast_protocol.h, "Sealed";
// docs/operations.md, "Sealed weight data"): three ranks as threads of this
// process. The trainer rank publishes through PublishOverBroadcast with a
// broadcast function that records every buffer it hands to Gloo (what
// crosses the pair sockets) before passing it on, and can alter one on the
// way, as someone on the pod network could.
//
// With a data-plane key, none of a version's bytes (a run of a known
// float32) appear in what crossed, and both workers commit full and delta
// versions bit-exact; an altered ciphertext is refused by every worker
// (DataLoss, counted as a decrypt failure); a worker holding another
// epoch's secret refuses a version the other commits; a trainer without a
// key withholds the payload. Without keys the same versions cross in the
// clear (so the first check could fail).

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/weights/broadcast/broadcast_protocol.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using testing::GroupConfig;

// Two float32 values, little-endian: 1.2345678f and 3.14159f.
constexpr uint8_t kPatternA[4] = {0x52, 0x06, 0x9E, 0x3F};
constexpr uint8_t kPatternB[4] = {0xD0, 0x0F, 0x49, 0x40};

void FillPattern(const FlatWeightLayout& layout, const uint8_t* pattern,
                 WeightBuffer* buf) {
  for (const TensorPlacement& t : layout.tensors()) {
    for (uint64_t i = 0; i < t.info.byte_size; ++i) {
      buf->data()[t.offset + i] = pattern[i % 4];
    }
  }
}

// Four floats of the pattern in a row.
bool HasRun(const std::string& wire, const uint8_t* pattern) {
  std::string needle;
  for (int i = 0; i < 4; ++i) {
    needle.append(reinterpret_cast<const char*>(pattern), 4);
  }
  return wire.find(needle) != std::string::npos;
}

std::shared_ptr<DataPlaneKeyHolder> Holder(const DataPlaneKey& key) {
  auto holder = std::make_shared<DataPlaneKeyHolder>();
  holder->Set(key);
  return holder;
}

struct Round {
  absl::Status status;
  BroadcastSealOutcome seal;
  std::vector<uint8_t> live;  // after a successful commit
};

// Runs one group: the trainer publishes v0 (FULL, pattern A), v1 (DELTA on
// v0), v2 (FULL, pattern B), then v3 (FULL, pattern A) with the first
// payload broadcast altered, v4 (FULL) with rank 2's key swapped for
// another epoch's, and v5 with the trainer holding no key. `keys` false:
// no keys anywhere (tls.mode off), v0..v2 only. Returns what crossed and
// each worker's rounds.
struct Run {
  std::string wire;
  std::vector<std::vector<Round>> rounds;  // [rank][version]
  std::vector<WeightBuffer> versions;
  absl::Status trainer;
};

// `pipelined`: pieces are started without waiting (StartBroadcast), as
// BroadcastWeightSender does, so the next one is sealed while one is on the
// wire; the capture sees the same bytes either way.
Run RunGroup(bool keys, uint64_t piece_bytes, const std::string& prefix,
             bool pipelined = false) {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  constexpr int kWorld = 3;
  const uint64_t versions = keys ? 6 : 3;
  Run run;
  for (int v = 0; v < 3; ++v) run.versions.emplace_back(layout.total_bytes());
  FillPattern(layout, kPatternA, &run.versions[0]);
  std::memcpy(run.versions[1].data(), run.versions[0].data(),
              layout.total_bytes());
  std::mt19937_64 rng(7);
  testing::Perturb(layout, &run.versions[1], rng, 0.05);
  FillPattern(layout, kPatternB, &run.versions[2]);

  auto key = NewDataPlaneKey(4);
  REQUIRE(key.ok());
  auto other = NewDataPlaneKey(5);
  REQUIRE(other.ok());
  std::vector<std::shared_ptr<DataPlaneKeyHolder>> holders;
  for (int r = 0; r < kWorld; ++r) holders.push_back(Holder(*key));
  auto empty = std::make_shared<DataPlaneKeyHolder>();

  run.rounds.resize(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      BroadcastGroupConfig config = GroupConfig(port, rank, kWorld, prefix);
      config.piece_bytes = piece_bytes;
      auto group = GlooBroadcastGroup::Create(
          config, rank == 0 ? server->get() : nullptr);
      if (!group.ok()) {
        if (rank == 0) run.trainer = group.status();
        return;
      }
      if (rank == 0) {
        int alter_at = -1;  // the broadcast (counted per version) to alter
        int count = 0;
        auto broadcast = [&](absl::Span<uint8_t> bytes) {
          if (count++ == alter_at) bytes[bytes.size() / 2] ^= 0x01;
          run.wire.append(reinterpret_cast<const char*>(bytes.data()),
                          bytes.size());
          return (*group)->Broadcast(bytes);
        };
        std::function<std::function<absl::Status()>(absl::Span<uint8_t>)>
            start;
        if (pipelined) {
          start = [&](absl::Span<uint8_t> bytes) {
            if (count++ == alter_at) bytes[bytes.size() / 2] ^= 0x01;
            run.wire.append(reinterpret_cast<const char*>(bytes.data()),
                            bytes.size());
            return (*group)->StartBroadcast(bytes);
          };
        }
        for (uint64_t v = 0; v < versions && run.trainer.ok(); ++v) {
          const WeightBuffer& w = run.versions[v == 1 ? 1 : v == 2 ? 2 : 0];
          auto m = layout.BuildManifest(w.span(), v);
          std::vector<uint8_t> payload(w.data(), w.data() + w.size());
          if (v == 1) {
            payload = *kernels::EncodeBf16Delta(
                kernels::AsWords(run.versions[0].span()),
                kernels::AsWords(run.versions[1].span()));
            m->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
            m->set_base_version(0);
          }
          count = 0;
          // Header, manifest, then the first payload piece.
          alter_at = v == 3 ? 2 : -1;
          const DataPlaneKeyHolder* with =
              !keys ? nullptr : v == 5 ? empty.get() : holders[0].get();
          run.trainer = PublishOverBroadcast(broadcast, *m, payload,
                                             piece_bytes, with, start);
        }
        return;
      }
      auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
      REQUIRE(staging.ok());
      GlooWeightReceiver receiver(group->get());
      receiver.set_data_plane_keys(keys ? holders[rank].get() : nullptr);
      for (uint64_t v = 0; v < versions; ++v) {
        if (v == 4 && rank == 2) holders[rank]->Set(*other);
        Round round;
        auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
        round.status = got.status();
        round.seal = receiver.last_seal();
        if (got.ok() && (*staging)->Commit().ok()) {
          const auto live = (*staging)->live().bytes;
          round.live.assign(live.begin(), live.end());
        }
        run.rounds[rank].push_back(std::move(round));
      }
    });
  }
  for (auto& t : threads) t.join();
  return run;
}

std::vector<uint8_t> Bytes(const WeightBuffer& w) {
  return {w.data(), w.data() + w.size()};
}

TEST_CASE(
    "Over a real Gloo broadcast with a data-plane key, no weight bytes "
    "cross in the clear, workers commit bit-exact, and an altered, "
    "foreign-keyed or withheld version is refused",
    "[weights][gloo][seal]") {
  // Buckets are 4096 bytes: 1000-byte pieces leave a short last piece.
  const uint64_t piece_bytes = GENERATE(uint64_t{0}, uint64_t{1000});
  const bool pipelined = GENERATE(false, true);
  INFO("piece_bytes " << piece_bytes << ", pipelined " << pipelined);
  Run run = RunGroup(/*keys=*/true, piece_bytes,
                     absl::StrCat("seal-", piece_bytes, "-", pipelined),
                     pipelined);
  INFO("trainer: " << run.trainer.ToString());
  REQUIRE(run.trainer.ok());
  CHECK_FALSE(HasRun(run.wire, kPatternA));
  CHECK_FALSE(HasRun(run.wire, kPatternB));
  for (int rank = 1; rank < 3; ++rank) {
    INFO("rank " << rank);
    const auto& rounds = run.rounds[rank];
    REQUIRE(rounds.size() == 6);
    for (int v = 0; v < 3; ++v) {
      INFO("v" << v << ": " << rounds[v].status.ToString());
      REQUIRE(rounds[v].status.ok());
      CHECK(rounds[v].seal.sealed);
      CHECK(rounds[v].live == Bytes(run.versions[v]));
    }
    // v3: a ciphertext byte altered on the wire.
    INFO("v3: " << rounds[3].status.ToString());
    CHECK(absl::IsDataLoss(rounds[3].status));
    CHECK(rounds[3].seal.decrypt_failed);
    CHECK(rounds[3].status.message().find(
              "broadcast: weights v3 bucket 0 offset 0: sealed piece 0") == 0);
    CHECK(rounds[3].live.empty());
    // v5: the trainer held no key.
    INFO("v5: " << rounds[5].status.ToString());
    CHECK(absl::IsUnavailable(rounds[5].status));
    CHECK(rounds[5].status.message().find("withheld") != std::string::npos);
  }
  // v4: rank 1 holds the epoch's key, rank 2 another epoch's.
  CHECK(run.rounds[1][4].status.ok());
  CHECK(run.rounds[1][4].live == Bytes(run.versions[0]));
  INFO("rank 2 v4: " << run.rounds[2][4].status.ToString());
  CHECK(absl::IsUnauthenticated(run.rounds[2][4].status));
  CHECK(run.rounds[2][4].seal.decrypt_failed);
  CHECK(run.rounds[2][4].status.message() ==
        "broadcast: weights v4 is sealed under data-plane epoch 4, this "
        "worker holds epoch 5");
}

TEST_CASE(
    "Over a real Gloo broadcast without keys (tls.mode off), versions cross "
    "in the clear",
    "[weights][gloo][seal]") {
  Run run = RunGroup(/*keys=*/false, 0, "plain");
  REQUIRE(run.trainer.ok());
  CHECK(HasRun(run.wire, kPatternA));
  CHECK(HasRun(run.wire, kPatternB));
  for (int rank = 1; rank < 3; ++rank) {
    for (int v = 0; v < 3; ++v) {
      REQUIRE(run.rounds[rank][v].status.ok());
      CHECK_FALSE(run.rounds[rank][v].seal.sealed);
      CHECK(run.rounds[rank][v].live == Bytes(run.versions[v]));
    }
  }
}

}  // namespace
}  // namespace tandem::weights
