// The trainer's broadcast dispatch (SendPayload, common/weights/broadcast/
// broadcast_sender.h), on the CPU: a FULL version with a device copy goes
// through the device publisher only when the group broadcasts device
// memory and nothing is sealed; a Gloo group, a DELTA, a sealed version or
// a job without a device copy take the host path. With the production
// device publisher (PublishDeviceOverBroadcast, a recording group and host
// memory standing in for the device), both paths put the same bytes on
// the wire.

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/weights/broadcast/broadcast_sender.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "weights_device_test_util.h"
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using testing::Bytes;
using testing::RecordingGroup;

// A recording group whose backend cannot broadcast device memory (Gloo).
class HostOnlyGroup : public RecordingGroup {
 public:
  bool broadcasts_device_memory() const override { return false; }
};

struct Version {
  v1::WeightManifest manifest;
  std::shared_ptr<const std::vector<uint8_t>> bytes;
  StoredPayload payload() const { return StoredPayload{manifest, bytes}; }
};

Version MakeVersion(uint64_t v, uint64_t seed) {
  const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(seed);
  WeightBuffer buffer(layout.total_bytes());
  testing::FillRandom(layout, &buffer, rng);
  auto manifest = layout.BuildManifest(buffer.span(), v);
  REQUIRE(manifest.ok());
  manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  return Version{*manifest, std::make_shared<const std::vector<uint8_t>>(
                                buffer.data(), buffer.data() + buffer.size())};
}

// A device publisher that only counts its calls (and sends nothing).
struct CountingPublisher {
  int calls = 0;
  const uint8_t* last = nullptr;
  DevicePublish fn() {
    return [this](BroadcastGroup*, const v1::WeightManifest&, const uint8_t* d,
                  uint64_t) {
      ++calls;
      last = d;
      return absl::OkStatus();
    };
  }
};

TEST_CASE(
    "A FULL version with a device copy goes from the device when the group "
    "takes device memory, else from host bytes",
    "[weights][device][broadcast_sender]") {
  const Version version = MakeVersion(3, 11);
  // "Device" copy: other memory holding the same bytes.
  auto device_bytes = std::make_shared<Bytes>(*version.bytes);
  const DeviceFlat device{device_bytes->data(), device_bytes->size(),
                          device_bytes};
  const absl::Time deadline = absl::Now() + absl::Seconds(10);

  SECTION("NCCL-like group: device path, host bytes untouched") {
    RecordingGroup group;
    CountingPublisher publisher;
    SentFrom from = SentFrom::kHost;
    REQUIRE(SendPayload(&group, version.payload(), &device, publisher.fn(),
                        nullptr, deadline, &from)
                .ok());
    CHECK(from == SentFrom::kDevice);
    CHECK(publisher.calls == 1);
    CHECK(publisher.last == device_bytes->data());
    CHECK(group.record.empty());  // the counting publisher sent nothing
  }
  SECTION("Gloo group: host path") {
    HostOnlyGroup group;
    CountingPublisher publisher;
    SentFrom from = SentFrom::kDevice;
    REQUIRE(SendPayload(&group, version.payload(), &device, publisher.fn(),
                        nullptr, deadline, &from)
                .ok());
    CHECK(from == SentFrom::kHost);
    CHECK(publisher.calls == 0);
    CHECK_FALSE(group.record.empty());
    for (bool d : group.from_device) CHECK_FALSE(d);
  }
  SECTION("no device copy, or no device publisher: host path") {
    RecordingGroup group;
    CountingPublisher publisher;
    SentFrom from = SentFrom::kDevice;
    REQUIRE(SendPayload(&group, version.payload(), nullptr, publisher.fn(),
                        nullptr, deadline, &from)
                .ok());
    CHECK(from == SentFrom::kHost);
    from = SentFrom::kDevice;
    REQUIRE(SendPayload(&group, version.payload(), &device, DevicePublish(),
                        nullptr, deadline, &from)
                .ok());
    CHECK(from == SentFrom::kHost);
    CHECK(publisher.calls == 0);
  }
  SECTION("a DELTA payload: host path") {
    RecordingGroup group;
    CountingPublisher publisher;
    StoredPayload delta = version.payload();
    delta.manifest.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
    delta.manifest.set_base_version(2);
    SentFrom from = SentFrom::kDevice;
    SendPayload(&group, delta, &device, publisher.fn(), nullptr, deadline,
                &from)
        .IgnoreError();  // not a real delta: only the route is checked
    CHECK(from == SentFrom::kHost);
    CHECK(publisher.calls == 0);
  }
  SECTION("sealed (a data-plane key holder): host path") {
    RecordingGroup group;
    CountingPublisher publisher;
    DataPlaneKeyHolder keys;
    SentFrom from = SentFrom::kDevice;
    SendPayload(&group, version.payload(), &device, publisher.fn(), &keys,
                deadline, &from)
        .IgnoreError();  // no key yet: the host sender withholds it
    CHECK(from == SentFrom::kHost);
    CHECK(publisher.calls == 0);
  }
  SECTION("a device copy of the wrong size: InvalidArgument, nothing sent") {
    RecordingGroup group;
    CountingPublisher publisher;
    const DeviceFlat short_copy{device_bytes->data(), device_bytes->size() - 2,
                                device_bytes};
    absl::Status s = SendPayload(&group, version.payload(), &short_copy,
                                 publisher.fn(), nullptr, deadline);
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("the device copy holds"));
    CHECK(publisher.calls == 0);
    CHECK(group.record.empty());
  }
}

TEST_CASE(
    "The device route with PublishDeviceOverBroadcast puts the host route's "
    "bytes on the wire",
    "[weights][device][broadcast_sender]") {
  const Version version = MakeVersion(7, 23);
  auto device_bytes = std::make_shared<Bytes>(*version.bytes);
  const DeviceFlat device{device_bytes->data(), device_bytes->size(),
                          device_bytes};
  const DevicePublish publish = [](BroadcastGroup* group,
                                   const v1::WeightManifest& manifest,
                                   const uint8_t* d, uint64_t bytes) {
    return PublishDeviceOverBroadcast(group, manifest, d, bytes);
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);

  RecordingGroup via_device;
  SentFrom from = SentFrom::kHost;
  REQUIRE(SendPayload(&via_device, version.payload(), &device, publish, nullptr,
                      deadline, &from)
              .ok());
  CHECK(from == SentFrom::kDevice);
  RecordingGroup via_host;
  REQUIRE(SendPayload(&via_host, version.payload(), nullptr, publish, nullptr,
                      deadline, &from)
              .ok());
  CHECK(from == SentFrom::kHost);

  // The buckets came from the device copy, the rest from the host...
  REQUIRE(via_device.from_device.size() > 2);
  CHECK(via_device.from_device.back());
  // ...and the concatenated stream is the host sender's, byte for byte.
  auto joined = [](const std::vector<Bytes>& record) {
    Bytes all;
    for (const Bytes& b : record) all.insert(all.end(), b.begin(), b.end());
    return all;
  };
  CHECK(joined(via_device.record) == joined(via_host.record));
}

}  // namespace
}  // namespace tandem::weights
