// Delta sync with the weights on the device (common/weights/
// device_delta.h, DeltaPublisher::set_change_compactor). On the CPU: the
// publisher takes the device path when both versions have device copies
// and publishes the host path's decisions and bytes. With a CUDA device
// (else a "skipping" warning): the CUDA compactor and the device patch
// give the host path's bytes.

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/weights/delta_publisher.h"
#include "common/weights/device_delta.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_device_test_util.h"
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using testing::Bytes;
using testing::Device;
using testing::Download;
using testing::Upload;

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
  int allocations_after_first = 0;
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
    // The device scratch is allocated by the first compaction and reused
    // by every later one (same sizes): no cudaMalloc per version.
    if (v == 2) allocations_after_first = compactor.DeviceAllocationsForTest();
    CHECK(compactor.DeviceAllocationsForTest() == allocations_after_first);
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
  CHECK(allocations_after_first > 0);
  // A malformed delta leaves the device buffer as it was.
  Bytes garbage(40, 0xAB);
  absl::Status s =
      ApplyDeltaOnDevice(garbage, d_previous.get(), previous->size());
  CHECK_FALSE(s.ok());
  CHECK(Download(d_previous.get(), previous->size()) == *previous);
}

}  // namespace
}  // namespace tandem::weights
