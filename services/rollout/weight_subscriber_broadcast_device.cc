// The WeightSubscriber's device broadcast receive: in an NCCL epoch, a
// worker whose live weights are on a CUDA device receives each version
// straight into a device buffer (ReceiveDeviceOverBroadcast), verifies it
// there (GoLiveFromStagedTensor: CRC-32C, finite check, the trusted tree
// digest on the device, or the trusted SHA-256 when there is none)
// and stages the live weights as views into that buffer, so the
// engine's swap stays a pointer swap with no host round trip; then the host
// staging follows. See weight_subscriber.h ("Device broadcast receive").
// Part of the WeightSubscriber class; runs on the subscriber's thread.
// Built with CUDA and NCCL only (TANDEM_DEVICE_BROADCAST); otherwise every
// broadcast takes the host path.

#include "services/rollout/weight_subscriber.h"

#if TANDEM_DEVICE_BROADCAST

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/device_go_live.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/pull/manifest_digest_source.h"
#include "common/weights/weight_digest.h"
#include "kernels/cuda/sha256_tree_cuda.h"

namespace tandem::rollout {

// The buffers versions are received into, and the one the live weights
// (last device go-live) view.
struct WeightSubscriber::DeviceBroadcast {
  weights::DeviceMemory* memory = nullptr;
  at::Device device{at::kCPU};
  bool host_memory = false;  // the test seam: no CUDA calls
  uint64_t bytes = 0;
  // A buffer is free when the pool holds its only reference (the live
  // weights' views and `live` hold the others).
  std::vector<std::shared_ptr<uint8_t>> pool;
  std::shared_ptr<uint8_t> live;
  std::optional<uint64_t> live_version;
  bool logged = false;  // the first device go-live was logged
};

namespace {

auto Log() { return ComponentLogger("rollout"); }

// The live version, the staged one the engine has not swapped in yet, and
// the one being received.
constexpr size_t kPoolBuffers = 3;

// A uint8 tensor over `n` bytes at `p` on `device`; with `keep`, holding
// it alive (the live weights' views keep it until the engine drops them).
absl::StatusOr<at::Tensor> BufferTensor(uint8_t* p, uint64_t n,
                                        at::Device device,
                                        std::shared_ptr<uint8_t> keep) {
  try {
    const auto options = at::TensorOptions().dtype(at::kByte).device(device);
    if (keep == nullptr) {
      return at::from_blob(p, {static_cast<int64_t>(n)}, options);
    }
    return at::from_blob(
        p, {static_cast<int64_t>(n)},
        [keep = std::move(keep)](void*) mutable { keep.reset(); }, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("viewing the broadcast buffer as a tensor on ",
                     device.str(), ": ", e.what_without_backtrace()));
  }
}

absl::Status Copy(const at::Tensor& dst, const at::Tensor& src,
                  const char* what) {
  try {
    dst.copy_(src);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("copying ", what, ": ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// Waits for all work on the device: the engine's kernels that may still
// read a buffer it dropped, and copies made on this thread's stream before
// the group's stream writes the same buffer.
absl::Status SyncDevice() {
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaDeviceSynchronize: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

// A free buffer of the pool (a new one while it has fewer than
// kPoolBuffers), or null.
std::shared_ptr<uint8_t> TakeBuffer(std::vector<std::shared_ptr<uint8_t>>* pool,
                                    weights::DeviceMemory* memory,
                                    uint64_t bytes) {
  for (const std::shared_ptr<uint8_t>& b : *pool) {
    if (b.use_count() == 1) return b;
  }
  if (pool->size() >= kPoolBuffers) return nullptr;
  absl::StatusOr<uint8_t*> p = memory->Allocate(bytes);
  if (!p.ok()) {
    Log()->warn("device broadcast buffer of {} bytes: {}", bytes,
                p.status().ToString());
    return nullptr;
  }
  pool->emplace_back(*p, [memory](uint8_t* q) { memory->Free(q); });
  return pool->back();
}

}  // namespace

void WeightSubscriber::SelectLiveDevice() {
  if (options_.device_memory_for_test != nullptr) return;
  const at::Device device = model_->weights()->device();
  if (!device.is_cuda() || !device.has_index()) return;
  if (const cudaError_t e = cudaSetDevice(device.index()); e != cudaSuccess) {
    Log()->warn("cudaSetDevice({}): {}", device.index(), cudaGetErrorString(e));
  }
}

bool WeightSubscriber::UseDeviceBroadcast() {
  // Sealed versions (a data-plane key) are opened on the host; inplace
  // mode receives into the live host buffer.
  if (group_ == nullptr || !group_->broadcasts_device_memory() ||
      options_.inplace_staging != nullptr ||
      options_.data_plane_key != nullptr) {
    return false;
  }
  if (device_broadcast_ != nullptr) return true;
  auto d = std::make_shared<DeviceBroadcast>();
  if (options_.device_memory_for_test != nullptr) {
    d->memory = options_.device_memory_for_test;
    d->host_memory = true;
  } else {
    d->device = model_->weights()->device();
    if (!d->device.is_cuda()) return false;
    d->memory = weights::CudaDeviceMemory();
  }
  d->bytes = staging_->layout().total_bytes();
  device_broadcast_ = std::move(d);
  return true;
}

bool WeightSubscriber::ReceiveBroadcastOnDevice(
    const tandem::v1::BroadcastGroup& g) {
  DeviceBroadcast& d = *device_broadcast_;
  if (!d.host_memory) {
    if (const absl::Status s = SyncDevice(); !s.ok()) {
      Log()->warn("device broadcast: {}; this version takes the host path",
                  s.ToString());
      return false;
    }
  }
  std::shared_ptr<uint8_t> buffer = TakeBuffer(&d.pool, d.memory, d.bytes);
  if (buffer == nullptr) {
    Log()->warn(
        "device broadcast: no free device buffer ({} held); this version "
        "takes the host path",
        d.pool.size());
    return false;
  }
  const absl::Time start = absl::Now();
  const weights::StagingStats staging_before = staging_->stats();
  absl::StatusOr<at::Tensor> staged =
      BufferTensor(buffer.get(), d.bytes, d.device, buffer);
  if (!staged.ok()) {
    Log()->warn("device broadcast: {}; this version takes the host path",
                staged.status().ToString());
    return false;
  }
  // The base a DELTA is patched onto: the version the host staging holds
  // (the one the trainer's deltas and the pull receiver plan from), from
  // the last device go-live's buffer when it is that version, else once
  // from the host staging's bytes. A FULL version overwrites it. Not known
  // before the manifest arrives, so copied for every version: one device
  // copy, no host round trip.
  std::optional<uint64_t> base = staging_->live_version();
  if (base.has_value()) {
    absl::Status based;
    if (d.live != nullptr && d.live_version == base) {
      absl::StatusOr<at::Tensor> live =
          BufferTensor(d.live.get(), d.bytes, d.device, nullptr);
      based = live.ok() ? Copy(*staged, *live, "the live device version")
                        : live.status();
    } else {
      const weights::LiveWeights host = staging_->live();
      based = Copy(
          *staged,
          at::from_blob(const_cast<uint8_t*>(host.bytes.data()),
                        {static_cast<int64_t>(host.bytes.size())}, at::kByte),
          "the host staging's live version to the device");
    }
    if (based.ok() && !d.host_memory) based = SyncDevice();
    if (!based.ok()) {
      // A DELTA is refused then (and pulled); a FULL version is taken.
      Log()->warn("device broadcast: no base for a delta: {}",
                  based.ToString());
      base.reset();
    }
  }
  weights::DeviceReceiveOptions receive;
  receive.staged_version = base;
  receive.memory_for_test = options_.device_memory_for_test;
  uint64_t round = 0;
  absl::StatusOr<v1::WeightManifest> manifest =
      weights::ReceiveDeviceOverBroadcast(group_.get(), buffer.get(), d.bytes,
                                          &round, receive);
  stream_version_ = std::max(stream_version_, round);
  if (!manifest.ok()) {
    if (group_->broken()) {
      AbandonGroup(manifest.status().ToString());
      return true;
    }
    if (manifest.status().code() == absl::StatusCode::kFailedPrecondition &&
        round <= received_version()) {
      return true;  // a version this worker already holds
    }
    // Counted as the host path counts a bad copy; the version is pulled.
    staging_->RecordRefusedElsewhere(
        round, weights::StagingWeights::RefusalOf(manifest.status()),
        /*pull_again=*/true);
    CountDigestChecks(staging_before, weights::SyncTransport::kBroadcast,
                      manifest.status());
    RejectBroadcast(round, manifest.status());
    return true;
  }
  const uint64_t version = manifest->policy_version();
  // The SHA-256 comes from the trainer's GetManifest, not from the
  // in-band manifest that crossed the pair sockets (as on the host path;
  // without a trainer address yet, JoinEpoch warned). Checked once, by
  // GoLiveFromStagedTensor, after the finite check; the receiver's digest
  // hook would hash the same bytes a second time.
  // The tree root, from the same GetManifest, is what a staging tensor on
  // a CUDA device is checked against (the device kernel), when there is one.
  weights::ManifestDigestSource::Digests trusted{
      .sha256 = manifest->sha256(), .tree_sha256 = manifest->tree_sha256()};
  absl::Status refused;
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights =
      absl::InternalError("not verified");
  if (broadcast_digests_ != nullptr) {
    absl::StatusOr<weights::ManifestDigestSource::Digests> t =
        broadcast_digests_->TrustedDigests(version);
    if (t.ok()) {
      trusted = *std::move(t);
    } else {
      refused = t.status();
    }
  }
  if (refused.ok()) {
    weights::DeviceGoLiveOptions go;
    weights::DeviceMemory* memory = d.memory;
    go.crc32c = [memory](const uint8_t* p, uint64_t n) {
      return memory->Crc32c(p, n);
    };
    go.expected_sha256 = trusted.sha256;
    go.expected_tree_sha256 = trusted.tree_sha256;
    if (staged->is_cuda()) {
      const int index = staged->device().index();
      go.tree_sha256 = [index](const uint8_t* p,
                               uint64_t n) -> absl::StatusOr<std::string> {
        if (cudaSetDevice(index) != cudaSuccess) {
          return absl::InternalError(
              absl::StrCat("cudaSetDevice(", index, ") failed"));
        }
        return kernels::cuda::Sha256TreeDevice(p, n);
      };
    }
    weights = weights::GoLiveFromStagedTensor(wire_config_, *manifest,
                                              staging_->layout(), *staged, go);
    if (!weights.ok()) refused = weights.status();
  }
  if (!refused.ok()) {
    // Counted as the host broadcast path counts its refusals; a bad copy
    // or digest is pulled, a non-finite version is not fetched again.
    staging_->RecordRefusedElsewhere(
        version, weights::StagingWeights::RefusalOf(refused),
        /*pull_again=*/true);
    CountNonFinite(staging_before.nonfinite_versions,
                   weights::SyncTransport::kBroadcast);
    CountDigestChecks(staging_before, weights::SyncTransport::kBroadcast,
                      refused);
    RejectBroadcast(version, refused);
    return true;
  }
  weights = MatchLiveWeights(*model_, *std::move(weights));
  if (!weights.ok()) {
    Log()->warn("policy version {} verified but not staged: {}", version,
                weights.status().ToString());
    return true;
  }
  source_->Stage(version, *std::move(weights));
  const absl::Time staged_at = absl::Now();
  d.live = buffer;
  d.live_version = version;
  const bool delta = manifest->kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA;
  if (!d.logged) {
    d.logged = true;
    Log()->info(
        "policy version {}: received by broadcast into {} memory and staged "
        "as views of it (no host round trip); later versions go the same way",
        version, d.host_memory ? "stand-in device" : d.device.str());
  }
  RecordReceived(*manifest, weights::SyncTransport::kBroadcast, start,
                 staged_at, staging_before.bytes_received);
  // The verified bytes are the whole version, whatever came on the wire:
  // the host staging follows as a FULL one (the bucket CRC-32Cs of a
  // DELTA's manifest are those of the patched version).
  v1::WeightManifest full = *manifest;
  full.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  full.set_base_version(0);
  full.set_sha256(trusted.sha256);
  full.set_tree_sha256(trusted.tree_sha256);
  received_.Record(version, weights::ManifestDigest(full),
                   weights::SyncTransport::kBroadcast,
                   manifest->published_unix_ms());
  const absl::Status followed =
      staging_->CommitVerifiedElsewhere(full, [&](absl::Span<uint8_t> dst) {
        return Copy(
            at::from_blob(dst.data(), {static_cast<int64_t>(dst.size())},
                          at::kByte),
            *staged, "the live version to the host");
      });
  CountDigestChecks(staging_before, weights::SyncTransport::kBroadcast,
                    followed);
  if (!followed.ok()) {
    Log()->error(
        "policy version {} is live from device memory, but the host staging "
        "could not follow it ({}); the next delta is patched onto v{}",
        version, followed.ToString(),
        staging_->live_version().has_value()
            ? std::to_string(*staging_->live_version())
            : std::string("none"));
  }
  if (!received_in_epoch_) {
    received_in_epoch_ = true;
    Log()->info(
        "received version {} by broadcast into device memory, the first of "
        "epoch {} ({}, {:.3f}s)",
        version, g.epoch(), delta ? "delta" : "full",
        absl::ToDoubleSeconds(absl::Now() - start));
  }
  return true;
}

}  // namespace tandem::rollout

#else  // !TANDEM_DEVICE_BROADCAST

namespace tandem::rollout {

struct WeightSubscriber::DeviceBroadcast {};

void WeightSubscriber::SelectLiveDevice() {}
bool WeightSubscriber::UseDeviceBroadcast() { return false; }
bool WeightSubscriber::ReceiveBroadcastOnDevice(
    const tandem::v1::BroadcastGroup&) {
  return false;
}

}  // namespace tandem::rollout

#endif  // TANDEM_DEVICE_BROADCAST
