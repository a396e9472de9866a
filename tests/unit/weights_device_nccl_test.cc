// NCCL between device buffers with two CUDA devices (ranks are threads,
// one device each; else a "skipping" warning naming why): device memory
// broadcast bit for bit to device and host ranks alike, and versions from
// device to device verified on the device, a corrupted one refused and a
// DELTA patched in place.

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_device_test_util.h"
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using testing::Bytes;
using testing::Download;
using testing::Upload;

bool TwoDevices() {
  absl::StatusOr<int> devices = NcclVisibleDevices();
  if (!devices.ok()) {
    WARN("skipping the NCCL part: " << devices.status().ToString());
    return false;
  }
  if (*devices < 2) {
    WARN("skipping the NCCL part: " << *devices
                                    << " CUDA device(s), a 2-rank NCCL "
                                       "group needs 2");
    return false;
  }
  return true;
}

NcclGroupConfig Nccl(uint16_t port, int rank, std::string prefix) {
  NcclGroupConfig c;
  c.store_port = port;
  c.rank = rank;
  c.world_size = 2;
  c.device = rank;
  c.key_prefix = std::move(prefix);
  c.timeout = absl::Seconds(30);
  c.bucket_bytes = 1000;  // every region goes in several pieces
  return c;
}

// Runs `rank0` and `rank1` on threads, each on its own device with its own
// group member.
template <typename F0, typename F1>
void TwoRanks(const std::string& prefix, F0 rank0, F1 rank1) {
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();
  absl::Status status1;
  std::thread t([&] {
    cudaSetDevice(1);
    auto g = NcclBroadcastGroup::Create(Nccl(port, 1, prefix));
    status1 = g.ok() ? rank1(g->get()) : g.status();
  });
  cudaSetDevice(0);
  auto g = NcclBroadcastGroup::Create(Nccl(port, 0, prefix));
  const absl::Status status0 = g.ok() ? rank0(g->get()) : g.status();
  t.join();
  INFO("rank 0: " << status0.ToString() << "; rank 1: " << status1.ToString());
  REQUIRE(status0.ok());
  REQUIRE(status1.ok());
}

TEST_CASE(
    "NCCL broadcasts device memory bit for bit, to device and host ranks "
    "alike",
    "[weights][nccl][cuda]") {
  if (!TwoDevices()) return;
  std::mt19937_64 rng(19);
  Bytes want(10'004);  // ten pieces and a short one
  for (auto& b : want) b = static_cast<uint8_t>(rng());
  // (sender from device memory, receiver into device memory)
  for (auto [send_device, receive_device] :
       {std::pair{true, true}, {true, false}, {false, true}}) {
    INFO("sender " << (send_device ? "device" : "host") << ", receiver "
                   << (receive_device ? "device" : "host"));
    Bytes got;
    TwoRanks(
        "bytes",
        [&](NcclBroadcastGroup* g) -> absl::Status {
          if (!send_device) {
            Bytes b = want;
            return g->Broadcast(absl::MakeSpan(b));
          }
          std::shared_ptr<uint8_t> d = Upload(want);
          return g->BroadcastDevice(d.get(), want.size());
        },
        [&](NcclBroadcastGroup* g) -> absl::Status {
          if (!receive_device) {
            got.assign(want.size(), 0);
            return g->Broadcast(absl::MakeSpan(got));
          }
          std::shared_ptr<uint8_t> d = Upload(Bytes(want.size(), 0));
          absl::Status s = g->BroadcastDevice(d.get(), want.size());
          got = Download(d.get(), want.size());
          return s;
        });
    CHECK(got == want);
  }
  // Host memory handed to BroadcastDevice is refused before anything is
  // sent, and the group stays whole.
  TwoRanks(
      "refuse",
      [&](NcclBroadcastGroup* g) -> absl::Status {
        Bytes host(64);
        absl::Status s = g->BroadcastDevice(host.data(), host.size());
        if (!absl::IsInvalidArgument(s) ||
            !absl::StrContains(s.message(), "not device memory")) {
          return absl::InternalError("want InvalidArgument, got " +
                                     s.ToString());
        }
        if (g->broken()) return absl::InternalError("group broken");
        return g->Broadcast(absl::MakeSpan(host));
      },
      [&](NcclBroadcastGroup* g) -> absl::Status {
        Bytes host(64);
        return g->Broadcast(absl::MakeSpan(host));
      });
}

TEST_CASE(
    "NCCL device-to-device versions are verified on the device: a corrupted "
    "one is refused, a DELTA is patched in place",
    "[weights][nccl][cuda]") {
  if (!TwoDevices()) return;
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(23);
  std::vector<Bytes> versions;
  WeightBuffer current(layout.total_bytes());
  testing::FillRandom(layout, &current, rng);
  for (int v = 0; v < 5; ++v) {
    if (v > 0) testing::Perturb(layout, &current, rng, 0.05);
    versions.emplace_back(current.data(), current.data() + current.size());
  }
  constexpr uint64_t kCorrupted = 2;
  constexpr uint64_t kDelta = 4;  // a DELTA on v3, sent from host bytes
  std::vector<absl::StatusOr<v1::WeightManifest>> received;
  std::vector<Bytes> staged;
  int digest_checks = 0;
  TwoRanks(
      "versions",
      [&](NcclBroadcastGroup* g) -> absl::Status {
        for (uint64_t v = 0; v < versions.size(); ++v) {
          auto m = layout.BuildManifest(
              absl::MakeSpan(versions[v].data(), versions[v].size()), v);
          if (!m.ok()) return m.status();
          if (v == kDelta) {
            auto delta =
                kernels::EncodeBf16Delta(kernels::AsWords(versions[v - 1]),
                                         kernels::AsWords(versions[v]));
            if (!delta.ok()) return delta.status();
            m->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
            m->set_base_version(v - 1);
            BroadcastWeightSender sender(g);
            if (absl::Status s =
                    sender.Publish(*m, *delta, absl::InfiniteFuture());
                !s.ok()) {
              return s;
            }
            continue;
          }
          Bytes payload = versions[v];
          if (v == kCorrupted) payload[payload.size() / 3] ^= 0x20;
          std::shared_ptr<uint8_t> d = Upload(payload);
          // The CRCs from the device bytes equal the host manifest's.
          v1::WeightManifest from_device = *m;
          if (absl::Status s =
                  FillDeviceBucketCrcs(&from_device, d.get(), payload.size());
              !s.ok()) {
            return s;
          }
          if (v != kCorrupted &&
              from_device.SerializeAsString() != m->SerializeAsString()) {
            return absl::InternalError("device CRCs differ from the host's");
          }
          if (absl::Status s =
                  PublishDeviceOverBroadcast(g, *m, d.get(), payload.size());
              !s.ok()) {
            return s;
          }
        }
        return absl::OkStatus();
      },
      [&](NcclBroadcastGroup* g) -> absl::Status {
        std::shared_ptr<uint8_t> d_staging =
            Upload(Bytes(layout.total_bytes(), 0));
        DeviceReceiveOptions options;
        options.digest_check = [&](const v1::WeightManifest&, const uint8_t*,
                                   uint64_t) {
          ++digest_checks;
          return absl::OkStatus();
        };
        for (uint64_t v = 0; v < versions.size(); ++v) {
          uint64_t round = 0;
          received.push_back(ReceiveDeviceOverBroadcast(
              g, d_staging.get(), layout.total_bytes(), &round, options));
          if (round != v) return absl::InternalError("round out of step");
          options.staged_version.reset();
          if (received.back().ok()) options.staged_version = v;
          staged.push_back(Download(d_staging.get(), layout.total_bytes()));
        }
        return absl::OkStatus();
      });
  REQUIRE(received.size() == versions.size());
  for (uint64_t v = 0; v < versions.size(); ++v) {
    INFO("v" << v << ": " << received[v].status().ToString());
    if (v == kCorrupted) {
      CHECK(absl::IsDataLoss(received[v].status()));
      CHECK_THAT(std::string(received[v].status().message()),
                 Catch::Contains("crc32c mismatch"));
      continue;
    }
    REQUIRE(received[v].ok());
    CHECK(received[v]->policy_version() == v);
    CHECK(received[v]->kind() == (v == kDelta ? v1::WEIGHT_PAYLOAD_KIND_DELTA
                                              : v1::WEIGHT_PAYLOAD_KIND_FULL));
    CHECK(staged[v] == versions[v]);
  }
  CHECK(digest_checks == static_cast<int>(versions.size()) - 1);
}

}  // namespace
}  // namespace tandem::weights
