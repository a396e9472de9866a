// The device weight path's broadcast (common/weights/broadcast/
// device_broadcast.h, device_digest_check.h), on the CPU: a Gloo group
// refuses device memory and stays usable; a device sender's stream
// (through a transport that records what it broadcasts) is exactly what
// the host receiver stages and verifies, and its refusals send nothing;
// the device receiver (host memory standing in for the device) stages and
// verifies FULL and DELTA versions, joins every broadcast of what it
// refuses, and its SHA-256 check catches bytes rewritten to keep their
// CRC-32C.

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/broadcast/device_digest_check.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/weight_digest.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_device_test_util.h"
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using testing::Bytes;
using testing::HostMemory;
using testing::RecordingGroup;
using testing::ReplayGroup;

TEST_CASE(
    "A Gloo group refuses device memory with FailedPrecondition and stays "
    "usable",
    "[weights][gloo][device]") {
  auto server = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(server.ok());
  auto group = CreateBroadcastGroup(
      testing::GroupConfig((*server)->port(), 0, 1, "device/refuse"),
      server->get());
  REQUIRE(group.ok());
  CHECK_FALSE((*group)->broadcasts_device_memory());
  Bytes region(64, 1);  // never read: the refusal comes first
  absl::Status s = (*group)->BroadcastDevice(region.data(), region.size());
  CHECK(absl::IsFailedPrecondition(s));
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("cannot broadcast device memory (64 bytes"));

  const FlatWeightLayout layout = testing::SmallLayout();
  WeightBuffer payload(layout.total_bytes());
  auto manifest = layout.BuildManifest(payload.span(), 1);
  REQUIRE(manifest.ok());
  s = PublishDeviceOverBroadcast(group->get(), *manifest, payload.data(),
                                 payload.size());
  CHECK(absl::IsFailedPrecondition(s));
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("cannot broadcast device memory"));
  uint64_t round = 0;
  auto received = ReceiveDeviceOverBroadcast(group->get(), payload.data(),
                                             payload.size(), &round);
  CHECK(absl::IsFailedPrecondition(received.status()));
  CHECK_THAT(std::string(received.status().message()),
             Catch::Contains("receive into host staging"));
  CHECK(round == 0);  // nothing joined
  // Nothing was sent: the group is whole and the host path works.
  CHECK_FALSE((*group)->broken());
  CHECK((*group)->Broadcast(absl::MakeSpan(region)).ok());
}

TEST_CASE(
    "A device sender's stream is what the host receiver stages and "
    "verifies, buckets from device memory in the header's pieces",
    "[weights][device]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(7);
  WeightBuffer payload(layout.total_bytes());
  testing::FillRandom(layout, &payload, rng);
  auto manifest = layout.BuildManifest(payload.span(), 4);
  REQUIRE(manifest.ok());
  REQUIRE(manifest->buckets_size() > 1);

  RecordingGroup sender;
  REQUIRE(PublishDeviceOverBroadcast(&sender, *manifest, payload.data(),
                                     payload.size())
              .ok());
  // Header and manifest from the host, then one device broadcast per
  // bucket (the group's piece size is 0: whole buckets), in place.
  REQUIRE(sender.record.size() == 2 + manifest->buckets_size());
  CHECK_FALSE(sender.from_device[0]);
  CHECK_FALSE(sender.from_device[1]);
  for (int i = 0; i < manifest->buckets_size(); ++i) {
    const v1::BucketSpec& b = manifest->buckets(i);
    CHECK(sender.from_device[2 + i]);
    CHECK(sender.record[2 + i] ==
          Bytes(payload.data() + b.byte_offset(),
                payload.data() + b.byte_offset() + b.byte_size()));
  }

  // The host receiver takes the same stream.
  ReplayGroup receiver(sender.record);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  BroadcastWeightReceiver host_receiver(&receiver);
  auto got = host_receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == 4);
  CHECK(receiver.done());
  REQUIRE((*staging)->Commit().ok());
  const LiveWeights live = (*staging)->live();
  CHECK(Bytes(live.bytes.begin(), live.bytes.end()) ==
        Bytes(payload.data(), payload.data() + payload.size()));

  // A flipped byte in device memory is caught by the receiver's CRC.
  RecordingGroup corrupt_sender;
  payload.data()[payload.size() / 2] ^= 0x08;
  auto next = *manifest;
  next.set_policy_version(5);
  REQUIRE(PublishDeviceOverBroadcast(&corrupt_sender, next, payload.data(),
                                     payload.size())
              .ok());
  ReplayGroup corrupt_receiver(corrupt_sender.record);
  BroadcastWeightReceiver host_receiver2(&corrupt_receiver);
  auto rejected =
      host_receiver2.ReceiveNext(staging->get(), absl::InfiniteFuture());
  CHECK(absl::IsDataLoss(rejected.status()));
  CHECK(corrupt_receiver.done());  // every broadcast joined all the same
  CHECK((*staging)->live_version() == 4);
}

TEST_CASE(
    "The device sender refuses sealed, DELTA and mis-sized versions before "
    "sending anything",
    "[weights][device]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightBuffer payload(layout.total_bytes());
  auto manifest = layout.BuildManifest(payload.span(), 2);
  REQUIRE(manifest.ok());
  RecordingGroup group;

  DataPlaneKeyHolder keys;
  absl::Status s = PublishDeviceOverBroadcast(&group, *manifest, payload.data(),
                                              payload.size(), &keys);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("tls.mode mtls"));

  v1::WeightManifest delta = *manifest;
  delta.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
  s = PublishDeviceOverBroadcast(&group, delta, payload.data(), payload.size());
  CHECK(absl::IsFailedPrecondition(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("only FULL versions"));

  s = PublishDeviceOverBroadcast(&group, *manifest, payload.data(),
                                 payload.size() - 64);
  CHECK(absl::IsInvalidArgument(s));
  CHECK_THAT(std::string(s.message()),
             Catch::Contains(absl::StrCat("weights v2 has ", payload.size(),
                                          " bytes, the device buffer ",
                                          payload.size() - 64)));
  CHECK(group.record.empty());
}

TEST_CASE(
    "The device receiver stages FULL and DELTA versions from host and device "
    "senders, verified, and joins every broadcast of what it refuses",
    "[weights][device]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(29);
  std::vector<Bytes> versions;
  WeightBuffer current(layout.total_bytes());
  testing::FillRandom(layout, &current, rng);
  for (int v = 0; v < 10; ++v) {
    if (v > 0) testing::Perturb(layout, &current, rng, 0.02);
    versions.emplace_back(current.data(), current.data() + current.size());
  }
  auto manifest = [&](uint64_t v) {
    auto m = layout.BuildManifest(
        absl::MakeConstSpan(versions[v].data(), versions[v].size()), v);
    REQUIRE(m.ok());
    return *m;
  };
  // Rank 0's broadcasts of a version: FULL from "device memory", or any
  // kind from host bytes through the host sender.
  auto from_device = [&](uint64_t v, Bytes payload) {
    RecordingGroup g;
    REQUIRE(PublishDeviceOverBroadcast(&g, manifest(v), payload.data(),
                                       payload.size())
                .ok());
    return g.record;
  };
  auto from_host = [&](const v1::WeightManifest& m, const Bytes& payload,
                       const DataPlaneKeyHolder* keys = nullptr) {
    RecordingGroup g;
    BroadcastWeightSender sender(&g, keys);
    REQUIRE(sender.Publish(m, payload, absl::InfiniteFuture()).ok());
    return g.record;
  };
  auto delta_on = [&](uint64_t v) {
    v1::WeightManifest m = manifest(v);
    m.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
    m.set_base_version(v - 1);
    auto d = kernels::EncodeBf16Delta(kernels::AsWords(versions[v - 1]),
                                      kernels::AsWords(versions[v]));
    REQUIRE(d.ok());
    return std::pair{m, *d};
  };

  HostMemory memory;
  Bytes staging(layout.total_bytes(), 0);
  int digests = 0;
  DeviceReceiveOptions options;
  options.memory_for_test = &memory;
  options.digest_check = [&](const v1::WeightManifest& m, const uint8_t* d,
                             uint64_t n) -> absl::Status {
    ++digests;
    if (m.policy_version() == 9) return absl::DataLossError("sha256 mismatch");
    return Bytes(d, d + n) == versions[m.policy_version()]
               ? absl::OkStatus()
               : absl::InternalError("digest check saw other bytes");
  };
  // Receives one recorded version; every broadcast must be joined.
  auto receive = [&](std::vector<Bytes> record) {
    ReplayGroup group(std::move(record), /*device=*/true);
    uint64_t round = 0;
    auto got = ReceiveDeviceOverBroadcast(&group, staging.data(),
                                          staging.size(), &round, options);
    CHECK(group.done());
    options.staged_version.reset();
    if (got.ok()) options.staged_version = got->policy_version();
    return got;
  };

  // FULL from a device sender and from a host sender.
  auto got = receive(from_device(1, versions[1]));
  REQUIRE(got.ok());
  CHECK(staging == versions[1]);
  got = receive(from_host(manifest(2), versions[2]));
  REQUIRE(got.ok());
  CHECK(staging == versions[2]);
  // A DELTA on the staged version is patched in place and verified.
  auto [m3, d3] = delta_on(3);
  got = receive(from_host(m3, d3));
  REQUIRE(got.ok());
  CHECK(got->kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA);
  CHECK(staging == versions[3]);
  CHECK(digests == 3);
  CHECK(memory.allocations == 0);

  // A flipped byte: DataLoss naming the bucket, no digest check.
  Bytes corrupt = versions[4];
  corrupt[corrupt.size() / 2] ^= 0x40;
  got = receive(from_device(4, corrupt));
  CHECK(absl::IsDataLoss(got.status()));
  CHECK_THAT(std::string(got.status().message()),
             Catch::Contains("crc32c mismatch"));
  CHECK(digests == 3);
  // A DELTA whose base is not staged (the last version failed).
  auto [m5, d5] = delta_on(5);
  got = receive(from_host(m5, d5));
  CHECK(absl::IsFailedPrecondition(got.status()));
  CHECK_THAT(std::string(got.status().message()),
             Catch::Contains("DELTA v5 is on v4, the device staging holds no "
                             "version"));

  got = receive(from_device(6, versions[6]));
  REQUIRE(got.ok());
  // A sealed version is joined into scratch and refused; staging keeps v6.
  DataPlaneKeyHolder keys;
  auto key = NewDataPlaneKey(1);
  REQUIRE(key.ok());
  keys.Set(*key);
  got = receive(from_host(manifest(7), versions[7], &keys));
  CHECK(absl::IsFailedPrecondition(got.status()));
  CHECK_THAT(std::string(got.status().message()), Catch::Contains("sealed"));
  CHECK(memory.allocations >= 1);
  CHECK(staging == versions[6]);
  // Withheld (a key holder without a key): nothing follows the manifest.
  DataPlaneKeyHolder empty_keys;
  got = receive(from_host(manifest(8), versions[8], &empty_keys));
  CHECK(absl::IsUnavailable(got.status()));
  // The digest check has the last word.
  got = receive(from_device(9, versions[9]));
  CHECK(absl::IsDataLoss(got.status()));
  CHECK(got.status().message() == "sha256 mismatch");

  // A header announcing a delta larger than the full copy cannot be
  // followed: the group is aborted.
  {
    auto [m, d] = delta_on(9);
    std::vector<Bytes> record = from_host(m, d);
    const uint64_t huge = uint64_t{1} << 40;
    std::memcpy(record[0].data() + 8, &huge, 8);  // the payload size
    ReplayGroup group(record, /*device=*/true);
    uint64_t round = 0;
    auto bad = ReceiveDeviceOverBroadcast(&group, staging.data(),
                                          staging.size(), &round, options);
    CHECK(absl::IsDataLoss(bad.status()));
    CHECK_THAT(std::string(bad.status().message()),
               Catch::Contains("-byte delta for weights v9"));
    CHECK(group.aborted);
  }

  // A version of another size is joined and refused.
  Bytes small(layout.total_bytes() - 64);
  ReplayGroup group(from_device(6, versions[6]), /*device=*/true);
  uint64_t round = 0;
  got = ReceiveDeviceOverBroadcast(&group, small.data(), small.size(), &round,
                                   options);
  CHECK(group.done());
  CHECK(round == 6);
  CHECK(absl::IsFailedPrecondition(got.status()));
  CHECK_THAT(std::string(got.status().message()),
             Catch::Contains("the device buffer"));
}

// Hands out a fixed digest, as the authenticated plane would.
class FixedDigest : public TrustedDigestSource {
 public:
  explicit FixedDigest(std::string digest) : digest_(std::move(digest)) {}
  absl::StatusOr<std::string> TrustedSha256(uint64_t) override {
    return digest_;
  }

 private:
  std::string digest_;
};

TEST_CASE(
    "The device receiver's SHA-256 check refuses bytes rewritten to keep "
    "their CRC-32C, and prefers the trusted digest to the in-band one",
    "[weights][device][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(31);
  WeightBuffer flat(layout.total_bytes());
  testing::FillRandom(layout, &flat, rng);
  const Bytes bytes(flat.data(), flat.data() + flat.size());
  auto manifest = layout.BuildManifest(flat.span(), 3);
  REQUIRE(manifest.ok());
  REQUIRE(manifest->sha256().size() == 32);
  RecordingGroup sender;
  REQUIRE(
      PublishDeviceOverBroadcast(&sender, *manifest, flat.data(), flat.size())
          .ok());

  HostMemory memory;
  auto receive = [&](std::vector<Bytes> record, DeviceDigestCheck check) {
    ReplayGroup group(std::move(record), /*device=*/true);
    Bytes staging(layout.total_bytes());
    DeviceReceiveOptions options;
    options.memory_for_test = &memory;
    options.digest_check = std::move(check);
    uint64_t round = 0;
    auto got = ReceiveDeviceOverBroadcast(&group, staging.data(),
                                          staging.size(), &round, options);
    CHECK(group.done());
    return got.status();
  };
  const c10::Device cpu(c10::kCPU);
  CHECK(receive(sender.record, DeviceSha256Check(cpu)).ok());

  // An attacker on the wire rewrites bucket 1 keeping its CRC-32C.
  std::vector<Bytes> tampered = sender.record;
  REQUIRE(testing::FlipKeepingCrc32c(absl::MakeSpan(tampered[3]), 16) > 0);
  absl::Status s = receive(tampered, DeviceSha256Check(cpu));
  CHECK(IsDigestMismatch(s));
  // ... and the in-band manifest's digest with it: the trusted one decides.
  std::vector<Bytes> forged = tampered;
  {
    v1::WeightManifest m = *manifest;
    Bytes flipped = bytes;
    const v1::BucketSpec& b = m.buckets(1);
    std::copy(tampered[3].begin(), tampered[3].end(),
              flipped.begin() + b.byte_offset());
    auto forged_manifest = layout.BuildManifest(flipped, 3);
    REQUIRE(forged_manifest.ok());
    RecordingGroup g;
    REQUIRE(PublishDeviceOverBroadcast(&g, *forged_manifest, flipped.data(),
                                       flipped.size())
                .ok());
    forged = g.record;
  }
  CHECK(receive(forged, DeviceSha256Check(cpu)).ok());  // in-band fooled
  FixedDigest trusted(manifest->sha256());
  CHECK(IsDigestMismatch(receive(forged, DeviceSha256Check(cpu, &trusted))));
  CHECK(receive(sender.record, DeviceSha256Check(cpu, &trusted)).ok());
  // No digest anywhere (a trainer that predates it): the CRCs decide.
  auto unsigned_manifest = layout.BuildManifest(flat.span(), 3, false);
  REQUIRE(unsigned_manifest.ok());
  RecordingGroup old;
  REQUIRE(PublishDeviceOverBroadcast(&old, *unsigned_manifest, flat.data(),
                                     flat.size())
              .ok());
  CHECK(receive(old.record, DeviceSha256Check(cpu)).ok());
}

}  // namespace
}  // namespace tandem::weights
