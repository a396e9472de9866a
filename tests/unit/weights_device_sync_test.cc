// Weight sync between device buffers (common/weights/broadcast/
// device_broadcast.h, common/weights/device_delta.h). On the CPU: a Gloo
// group refuses device memory and stays usable; a device sender's stream
// (through a transport that records what it broadcasts) is exactly what
// the host receiver stages and verifies; its refusals send nothing; the
// DeltaPublisher takes the device path when both versions have device
// copies and publishes the same bytes as the host path. With a CUDA
// device (else these cases pass with a "skipping" warning): the CUDA
// compactor and the device patch give the host path's bytes. With two
// (ranks are threads, one device each): NCCL broadcasts device memory bit
// for bit to device and host ranks alike, and device-to-device versions
// are verified on the device, a corrupted one refused.

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/broadcast/device_digest_check.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#include "common/weights/delta_publisher.h"
#include "common/weights/device_delta.h"
#include "common/weights/weight_digest.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "kernels/crc32c.h"
#include "kernels/cuda/bf16_delta_cuda.h"
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;

// Rank 0 of a group that claims device memory but runs on host bytes:
// records every broadcast, and which kind of call carried it.
class RecordingGroup : public BroadcastGroup {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  bool broken() const override { return false; }
  bool broadcasts_device_memory() const override { return true; }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    record.emplace_back(bytes.begin(), bytes.end());
    from_device.push_back(false);
    return absl::OkStatus();
  }
  absl::Status BroadcastDevice(void* ptr, uint64_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(ptr);
    record.emplace_back(p, p + bytes);
    from_device.push_back(true);
    return absl::OkStatus();
  }
  void Abort() override {}

  std::vector<Bytes> record;
  std::vector<bool> from_device;
};

// Plays a recording to a receiving rank, one broadcast after the other;
// with `device`, it also takes "device" broadcasts, into host memory.
class ReplayGroup : public BroadcastGroup {
 public:
  explicit ReplayGroup(std::vector<Bytes> record, bool device = false)
      : record_(std::move(record)), device_(device) {}
  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  bool broken() const override { return false; }
  bool broadcasts_device_memory() const override { return device_; }
  absl::Status BroadcastDevice(void* ptr, uint64_t bytes) override {
    if (!device_) return BroadcastGroup::BroadcastDevice(ptr, bytes);
    return Broadcast({static_cast<uint8_t*>(ptr), bytes});
  }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    if (next_ >= record_.size() || record_[next_].size() != bytes.size()) {
      return absl::DataLossError(
          absl::StrCat("replay: broadcast ", next_, " of ", bytes.size(),
                       " bytes, the "
                       "recording has ",
                       next_ < record_.size() ? record_[next_].size() : 0));
    }
    std::memcpy(bytes.data(), record_[next_++].data(), bytes.size());
    return absl::OkStatus();
  }
  void Abort() override { aborted = true; }
  bool done() const { return next_ == record_.size(); }
  bool aborted = false;

 private:
  std::vector<Bytes> record_;
  bool device_;
  size_t next_ = 0;
};

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

// Host memory standing in for device memory in the device receiver.
class HostMemory : public DeviceMemory {
 public:
  absl::StatusOr<uint32_t> Crc32c(const uint8_t* d, uint64_t n) override {
    return kernels::Crc32c(d, n);
  }
  absl::Status ApplyDelta(absl::Span<const uint8_t> delta, uint8_t* d,
                          uint64_t n) override {
    return kernels::ApplyBf16Delta(
        delta, absl::MakeSpan(reinterpret_cast<uint16_t*>(d), n / 2));
  }
  absl::StatusOr<uint8_t*> Allocate(uint64_t n) override {
    ++allocations;
    return new uint8_t[n];
  }
  void Free(uint8_t* d) override { delete[] d; }
  int allocations = 0;
};

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

// Compares on the host, treating the "device" pointers as host memory: the
// publisher's dispatch and bookkeeping without a GPU.
class HostCompactor : public ChangeCompactor {
 public:
  absl::StatusOr<CompactedChange> Compact(const DeviceFlat& prev,
                                          const DeviceFlat& next,
                                          uint64_t max_listed) override {
    ++calls;
    if (fail) return absl::InternalError("cudaMalloc: out of memory");
    const auto* p = reinterpret_cast<const uint16_t*>(prev.data);
    const auto* n = reinterpret_cast<const uint16_t*>(next.data);
    CompactedChange out;
    for (uint64_t i = 0; i < next.bytes / 2; ++i) {
      if (p[i] == n[i]) continue;
      ++out.changed_words;
      out.indices.push_back(i);
      out.new_words.push_back(n[i]);
      out.old_words.push_back(p[i]);
    }
    if (out.changed_words > max_listed) out = {out.changed_words};
    return out;
  }
  int calls = 0;
  bool fail = false;
};

DeviceFlat AsDevice(const std::shared_ptr<const Bytes>& bytes) {
  return {bytes->data(), bytes->size(), bytes};
}

TEST_CASE(
    "DeltaPublisher finds changes through its compactor when both versions "
    "have device copies, with the host path's decisions and bytes",
    "[weights][delta][device]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  DeltaPublishOptions options;
  options.anchor_every = 4;
  options.max_density = 0.25;
  auto host = DeltaPublisher::Create(options);
  auto device = DeltaPublisher::Create(options);
  REQUIRE(host.ok());
  REQUIRE(device.ok());
  HostCompactor compactor;
  device->set_change_compactor(&compactor);

  std::mt19937_64 rng(13);
  WeightBuffer current(layout.total_bytes());
  testing::FillRandom(layout, &current, rng);
  // Sparse, dense (above max_density), sparse, scheduled anchor, sparse.
  const std::vector<double> density = {0, 0.02, 0.6, 0.05, 0.01, 0.03};
  int device_compares = 0;
  for (uint64_t v = 1; v < density.size(); ++v) {
    if (density[v] > 0) testing::Perturb(layout, &current, rng, density[v]);
    auto manifest = layout.BuildManifest(current.span(), v);
    REQUIRE(manifest.ok());
    auto bytes = std::make_shared<const Bytes>(current.data(),
                                               current.data() + current.size());
    auto a = host->Publish(*manifest, bytes);
    auto b = device->Publish(*manifest, bytes, AsDevice(bytes));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    INFO("v" << v << ": " << PublishReasonName(a->reason));
    CHECK_FALSE(a->compared_on_device);
    // v1 has no base; from v2 on both versions have device copies.
    CHECK(b->compared_on_device == (v >= 2));
    device_compares += b->compared_on_device;
    CHECK(b->reason == a->reason);
    CHECK(b->changed_words == a->changed_words);
    CHECK(b->density == a->density);
    REQUIRE(b->delta.has_value() == a->delta.has_value());
    if (a->delta.has_value()) {
      CHECK(*b->delta->bytes == *a->delta->bytes);
      CHECK(b->delta->manifest.SerializeAsString() ==
            a->delta->manifest.SerializeAsString());
    }
    CHECK(b->full.manifest.SerializeAsString() ==
          a->full.manifest.SerializeAsString());
  }
  CHECK(device_compares == compactor.calls);
  CHECK(compactor.calls == 4);

  // A version without a device copy, and the one after it (its base has
  // none), are compared on the host.
  testing::Perturb(layout, &current, rng, 0.02);
  auto m6 = layout.BuildManifest(current.span(), 6);
  auto b6 = std::make_shared<const Bytes>(current.data(),
                                          current.data() + current.size());
  auto p6 = device->Publish(*m6, b6);
  REQUIRE(p6.ok());
  CHECK_FALSE(p6->compared_on_device);
  CHECK(p6->reason == PublishReason::kDelta);
  testing::Perturb(layout, &current, rng, 0.02);
  auto m7 = layout.BuildManifest(current.span(), 7);
  auto b7 = std::make_shared<const Bytes>(current.data(),
                                          current.data() + current.size());
  auto p7 = device->Publish(*m7, b7, AsDevice(b7));
  REQUIRE(p7.ok());
  CHECK_FALSE(p7->compared_on_device);

  // A compactor failure fails the version, naming it; a device copy of
  // another size is refused.
  compactor.fail = true;
  testing::Perturb(layout, &current, rng, 0.02);
  auto m8 = layout.BuildManifest(current.span(), 8);
  auto b8 = std::make_shared<const Bytes>(current.data(),
                                          current.data() + current.size());
  auto p8 = device->Publish(*m8, b8, AsDevice(b8));
  CHECK(absl::IsInternal(p8.status()));
  CHECK_THAT(std::string(p8.status().message()),
             Catch::StartsWith("weights v8: device change detection: "));
  auto p9 = device->Publish(*m8, b8, DeviceFlat{b8->data(), 6, nullptr});
  CHECK(absl::IsInvalidArgument(p9.status()));
}

// ---- With a CUDA device ----

bool Device() {
  if (kernels::cuda::DeviceAvailable()) return true;
  WARN("no CUDA device: skipping");
  return false;
}

// Device memory holding a copy of `host`, freed with the last owner.
std::shared_ptr<uint8_t> Upload(const Bytes& host) {
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, std::max<size_t>(host.size(), 1)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(d),
                                  [](uint8_t* p) { cudaFree(p); });
}

Bytes Download(const uint8_t* d, size_t n) {
  Bytes host(n);
  REQUIRE(cudaMemcpy(host.data(), d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

TEST_CASE(
    "On a GPU the CUDA compactor publishes the host path's deltas and the "
    "device patch reproduces the host patch byte for byte",
    "[weights][delta][cuda]") {
  if (!Device()) return;
  const FlatWeightLayout layout = testing::SmallLayout();
  DeltaPublishOptions options;
  options.anchor_every = 8;
  options.max_density = 0.3;
  auto host = DeltaPublisher::Create(options);
  auto device = DeltaPublisher::Create(options);
  REQUIRE(host.ok());
  REQUIRE(device.ok());
  // Small slices, so one version is compacted in many.
  CudaChangeCompactor compactor(/*slice_words=*/1000);
  device->set_change_compactor(&compactor);
  std::mt19937_64 rng(17);
  WeightBuffer current(layout.total_bytes());
  testing::FillRandom(layout, &current, rng);
  std::shared_ptr<const Bytes> previous;
  std::shared_ptr<uint8_t> d_previous;
  int deltas = 0;
  for (uint64_t v = 1; v <= 6; ++v) {
    if (v > 1) testing::Perturb(layout, &current, rng, v == 4 ? 0.5 : 0.03);
    auto manifest = layout.BuildManifest(current.span(), v);
    REQUIRE(manifest.ok());
    auto bytes = std::make_shared<const Bytes>(current.data(),
                                               current.data() + current.size());
    std::shared_ptr<uint8_t> d_bytes = Upload(*bytes);
    auto a = host->Publish(*manifest, bytes);
    auto b = device->Publish(*manifest, bytes,
                             DeviceFlat{d_bytes.get(), bytes->size(), d_bytes});
    REQUIRE(a.ok());
    INFO("v" << v << ": " << b.status().ToString());
    REQUIRE(b.ok());
    CHECK(b->compared_on_device == (v > 1));
    CHECK(b->reason == a->reason);
    CHECK(b->changed_words == a->changed_words);
    REQUIRE(b->delta.has_value() == a->delta.has_value());
    if (a->delta.has_value()) {
      ++deltas;
      CHECK(*b->delta->bytes == *a->delta->bytes);
      // The previous version's device copy, patched on the device, is
      // this version; the host patch agrees.
      std::shared_ptr<uint8_t> d_base = Upload(*previous);
      REQUIRE(
          ApplyDeltaOnDevice(*b->delta->bytes, d_base.get(), previous->size())
              .ok());
      Bytes host_patched = *previous;
      REQUIRE(kernels::ApplyBf16Delta(
                  *a->delta->bytes, absl::MakeSpan(reinterpret_cast<uint16_t*>(
                                                       host_patched.data()),
                                                   host_patched.size() / 2))
                  .ok());
      CHECK(Download(d_base.get(), previous->size()) == host_patched);
      CHECK(host_patched == *bytes);
    }
    previous = bytes;
    d_previous = d_bytes;
  }
  CHECK(deltas >= 3);
  // A malformed delta leaves the device buffer as it was.
  Bytes garbage(40, 0xAB);
  absl::Status s =
      ApplyDeltaOnDevice(garbage, d_previous.get(), previous->size());
  CHECK_FALSE(s.ok());
  CHECK(Download(d_previous.get(), previous->size()) == *previous);
}

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
