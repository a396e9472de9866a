#include "common/weights/broadcast/device_broadcast.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/device_delta.h"
#include "kernels/cuda/crc32c_cuda.h"

namespace tandem::weights {
namespace {

constexpr uint64_t kTagBytes = 16;  // a sealed piece's AES-GCM tag

absl::Status CheckBuckets(const v1::WeightManifest& m, uint64_t bytes) {
  if (m.total_bytes() != bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights v", m.policy_version(), " has ", m.total_bytes(),
                     " bytes, the device buffer ", bytes));
  }
  for (int i = 0; i < m.buckets_size(); ++i) {
    const v1::BucketSpec& b = m.buckets(i);
    if (b.byte_offset() > bytes || b.byte_size() > bytes - b.byte_offset()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights v", m.policy_version(), " bucket ", i, " [",
                       b.byte_offset(), ", +", b.byte_size(),
                       ") lies outside the ", bytes, "-byte device buffer"));
    }
  }
  return absl::OkStatus();
}

// Device memory for pieces this rank joins but cannot keep; grown on use.
class DeviceScratch {
 public:
  explicit DeviceScratch(DeviceMemory* memory) : memory_(memory) {}
  ~DeviceScratch() {
    if (data_ != nullptr) memory_->Free(data_);
  }
  absl::StatusOr<uint8_t*> Get(uint64_t n) {
    if (n <= size_ && data_ != nullptr) return data_;
    if (data_ != nullptr) memory_->Free(data_);
    data_ = nullptr;
    size_ = 0;
    absl::StatusOr<uint8_t*> d = memory_->Allocate(std::max<uint64_t>(n, 4));
    if (!d.ok()) return d.status();
    data_ = *d;
    size_ = n;
    return data_;
  }

 private:
  DeviceMemory* memory_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Each operation runs on a stream of its own that does not synchronise with
// the legacy default stream, so a receiver in the background never waits
// for (nor holds up) the engine's kernels on the same device.
class CudaMemory : public DeviceMemory {
 public:
  absl::StatusOr<uint32_t> Crc32c(const uint8_t* d, uint64_t n) override {
    return OnOwnStream(
        [&](cudaStream_t s) { return kernels::cuda::Crc32cDevice(d, n, s); });
  }
  absl::Status ApplyDelta(absl::Span<const uint8_t> delta, uint8_t* d,
                          uint64_t n) override {
    return OnOwnStream(
        [&](cudaStream_t s) { return ApplyDeltaOnDevice(delta, d, n, s); });
  }
  absl::StatusOr<uint8_t*> Allocate(uint64_t n) override {
    void* d = nullptr;
    if (cudaError_t e = cudaMalloc(&d, n); e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("device broadcast: cudaMalloc of ", n,
                       " scratch bytes: ", cudaGetErrorString(e)));
    }
    return static_cast<uint8_t*>(d);
  }
  void Free(uint8_t* d) override { cudaFree(d); }

 private:
  // f(stream) on a new non-blocking stream; its Status or StatusOr.
  template <typename F>
  static auto OnOwnStream(F f) -> decltype(f(nullptr)) {
    cudaStream_t stream = nullptr;
    if (cudaError_t e =
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat(
          "device broadcast: cudaStreamCreate: ", cudaGetErrorString(e)));
    }
    auto result = f(stream);
    cudaStreamDestroy(stream);
    return result;
  }
};

}  // namespace

DeviceMemory* CudaDeviceMemory() {
  static CudaMemory* const memory = new CudaMemory();
  return memory;
}

absl::Status FillDeviceBucketCrcs(v1::WeightManifest* manifest,
                                  const uint8_t* d_payload, uint64_t bytes) {
  for (int i = 0; i < manifest->buckets_size(); ++i) {
    v1::BucketSpec* b = manifest->mutable_buckets(i);
    if (b->byte_offset() > bytes || b->byte_size() > bytes - b->byte_offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", i, " [", b->byte_offset(), ", +", b->byte_size(),
          ") lies outside the ", bytes, "-byte device payload"));
    }
    absl::StatusOr<uint32_t> crc = kernels::cuda::Crc32cDevice(
        d_payload + b->byte_offset(), b->byte_size());
    if (!crc.ok()) return crc.status();
    b->set_crc32c(*crc);
  }
  return absl::OkStatus();
}

absl::Status PublishDeviceOverBroadcast(BroadcastGroup* group,
                                        const v1::WeightManifest& manifest,
                                        const uint8_t* d_payload,
                                        uint64_t bytes,
                                        const DataPlaneKeyHolder* keys) {
  const std::string what =
      absl::StrCat("device broadcast of weights v", manifest.policy_version());
  if (!group->broadcasts_device_memory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": this group's backend cannot broadcast device memory"));
  }
  if (keys != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": sealed broadcast (tls.mode mtls) seals host bytes; copy the "
        "payload to the host and use BroadcastWeightSender"));
  }
  if (manifest.kind() != v1::WEIGHT_PAYLOAD_KIND_FULL) {
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     ": only FULL versions go from device memory (a DELTA's "
                     "encoded payload is host bytes: BroadcastWeightSender)"));
  }
  if (absl::Status s = CheckBuckets(manifest, bytes); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  const uint64_t piece_bytes = group->piece_bytes() & ~uint64_t{3};
  if (absl::Status s = BroadcastPlainPreamble(
          [group](absl::Span<uint8_t> b) { return group->Broadcast(b); },
          manifest, bytes, piece_bytes);
      !s.ok()) {
    return s;
  }
  // Root buffers are only read by the broadcast.
  auto* data = const_cast<uint8_t*>(d_payload);
  for (const v1::BucketSpec& b : manifest.buckets()) {
    const uint64_t piece = piece_bytes == 0 ? b.byte_size() : piece_bytes;
    for (uint64_t off = 0; off < b.byte_size(); off += piece) {
      const uint64_t n = std::min(piece, b.byte_size() - off);
      if (absl::Status s =
              group->BroadcastDevice(data + b.byte_offset() + off, n);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::WeightManifest> ReceiveDeviceOverBroadcast(
    BroadcastGroup* group, uint8_t* d_staging, uint64_t bytes,
    uint64_t* round_version, const DeviceReceiveOptions& options) {
  if (!group->broadcasts_device_memory()) {
    return absl::FailedPreconditionError(
        "device broadcast receive: this group's backend cannot broadcast "
        "device memory; receive into host staging (BroadcastWeightReceiver)");
  }
  auto host = [group](absl::Span<uint8_t> b) { return group->Broadcast(b); };
  absl::StatusOr<BroadcastPreamble> preamble =
      ReceiveBroadcastPreamble(host, [group] { group->Abort(); });
  if (!preamble.ok()) return preamble.status();
  const v1::WeightManifest& manifest = preamble->manifest;
  const uint64_t v = manifest.policy_version();
  *round_version = v;
  if (preamble->sealing == kBroadcastWithheld) {
    return absl::UnavailableError(
        absl::StrCat("broadcast: weights v", v,
                     " withheld: the trainer holds no data-plane secret yet"));
  }
  const bool sealed = preamble->sealing == kBroadcastSealed;
  const bool full = manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL;
  // From here on every broadcast of the version is joined; `local` is the
  // first local failure.
  absl::Status local;
  if (sealed) {
    local = absl::FailedPreconditionError(absl::StrCat(
        "broadcast: weights v", v,
        " came sealed (tls.mode mtls); sealed versions are opened in host "
        "memory, not received into device staging"));
  } else if (absl::Status s = CheckBuckets(manifest, bytes); !s.ok()) {
    local = absl::FailedPreconditionError(s.message());
  } else if (!full && (!options.staged_version.has_value() ||
                       *options.staged_version != manifest.base_version())) {
    local = absl::FailedPreconditionError(
        absl::StrCat("broadcast: DELTA v", v, " is on v",
                     manifest.base_version(), ", the device staging holds ",
                     options.staged_version.has_value()
                         ? absl::StrCat("v", *options.staged_version)
                         : std::string("no version")));
  }
  auto receive_tag = [&] {
    uint8_t tag[kTagBytes];
    return group->Broadcast({tag, kTagBytes});
  };
  DeviceMemory* memory = options.memory_for_test != nullptr
                             ? options.memory_for_test
                             : CudaDeviceMemory();
  DeviceScratch scratch(memory);
  if (full) {
    const uint64_t piece_bytes = preamble->piece_bytes;
    for (int i = 0; i < manifest.buckets_size(); ++i) {
      const v1::BucketSpec& b = manifest.buckets(i);
      const uint64_t step = piece_bytes == 0 ? b.byte_size() : piece_bytes;
      for (uint64_t off = 0; off < b.byte_size(); off += step) {
        const uint64_t n = std::min(step, b.byte_size() - off);
        uint8_t* target = d_staging + b.byte_offset() + off;
        if (!local.ok()) {
          absl::StatusOr<uint8_t*> s = scratch.Get(n);
          if (!s.ok()) {
            group->Abort();  // cannot join the rest
            return s.status();
          }
          target = *s;
        }
        if (absl::Status s = group->BroadcastDevice(target, n); !s.ok()) {
          return s;
        }
        if (sealed && n > 0) {
          if (absl::Status s = receive_tag(); !s.ok()) return s;
        }
      }
      if (!local.ok()) continue;
      absl::StatusOr<uint32_t> crc =
          memory->Crc32c(d_staging + b.byte_offset(), b.byte_size());
      if (!crc.ok()) {
        local = crc.status();
      } else if (*crc != b.crc32c()) {
        local = absl::DataLossError(absl::StrCat(
            "broadcast: weights v", v, " bucket ", i, " crc32c mismatch: got ",
            *crc, ", manifest says ", b.crc32c()));
      }
    }
  } else {
    // The encoded delta: host pieces of at most bucket_bytes, each padded
    // to a multiple of 4 (broadcast_protocol.h).
    std::vector<uint8_t> delta(preamble->payload_bytes);
    const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
    std::vector<uint8_t> buf;
    for (uint64_t off = 0; off < delta.size(); off += piece) {
      const uint64_t n = std::min(piece, delta.size() - off);
      buf.assign((n + 3) & ~uint64_t{3}, 0);
      if (absl::Status s = group->Broadcast(absl::MakeSpan(buf)); !s.ok()) {
        return s;
      }
      if (sealed) {
        if (absl::Status s = receive_tag(); !s.ok()) return s;
      }
      std::copy(buf.begin(), buf.begin() + n, delta.begin() + off);
    }
    if (local.ok()) local = memory->ApplyDelta(delta, d_staging, bytes);
    for (int i = 0; local.ok() && i < manifest.buckets_size(); ++i) {
      const v1::BucketSpec& b = manifest.buckets(i);
      absl::StatusOr<uint32_t> crc =
          memory->Crc32c(d_staging + b.byte_offset(), b.byte_size());
      if (!crc.ok()) {
        local = crc.status();
      } else if (*crc != b.crc32c()) {
        local = absl::DataLossError(absl::StrCat(
            "broadcast: weights v", v, " (DELTA on v", manifest.base_version(),
            ") bucket ", i, " crc32c mismatch after the patch: got ", *crc,
            ", manifest says ", b.crc32c()));
      }
    }
  }
  if (local.ok() && options.digest_check) {
    local = options.digest_check(manifest, d_staging, bytes);
  }
  if (!local.ok()) return local;
  return manifest;
}

}  // namespace tandem::weights
