#pragma once

// Weight broadcast between device buffers (issue 22 item 4): the trainer
// sends a version straight from its flat device payload, a worker receives
// it straight into its device staging buffer, with no host round trip for
// the weights. Same wire protocol as the host path (broadcast_protocol.h):
// the header and manifest are small host broadcasts, the FULL buckets go
// through BroadcastGroup::BroadcastDevice in the header's pieces. Since
// BroadcastDevice cuts a region into collectives exactly as Broadcast()
// cuts a host span, a device sender feeds host receivers and a host sender
// feeds device receivers in one group.
//
// Verification (nothing goes live unverified): the receiver checks every
// bucket's CRC-32C on the device (kernels/cuda/crc32c_cuda.h: per-chunk
// CRCs on the GPU, joined on the host) against the manifest, then calls
// the caller's digest check (SHA-256 over the whole staged buffer against
// the trusted digest: DeviceSha256Check, device_digest_check.h) before it
// returns OK. Only then may the caller make the staging buffer live
// (a pointer swap) or, in inplace mode, let readers back into it.
//
// What stays on the host path: sealed versions (tls.mode mtls: AES-GCM
// runs on the host bytes), so the device sender refuses to send with a
// key holder, and the device receiver joins a sealed version's broadcasts
// and refuses it (FailedPrecondition: pull it, or receive into host
// staging); and Gloo groups (broadcasts_device_memory() false), which both
// functions refuse before joining anything. The finite check of
// StagingWeights (no Inf/NaN) is not done on the device yet.
//
// Trainer hook (services/trainer is not edited here): where the trainer
// holds the published version's flat payload on its device, it fills the
// manifest's CRCs with FillDeviceBucketCrcs, synchronises the stream that
// wrote the payload, and calls PublishDeviceOverBroadcast(group, manifest,
// payload pointer, size) in place of BroadcastWeightSender::Publish when
// group->broadcasts_device_memory() and no data-plane key is in use.
//
// Built only with TANDEM_ENABLE_CUDA and NCCL (library tandem_weights_cuda).
// Thread-compatible: one thread per group, as for the host path.

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

// Sets every bucket's crc32c in `manifest` from the device payload it
// describes (kernels::cuda::Crc32cDevice), as FlatWeightLayout's
// BuildManifest does from host bytes. InvalidArgument when a bucket lies
// outside [d_payload, d_payload + bytes).
absl::Status FillDeviceBucketCrcs(v1::WeightManifest* manifest,
                                  const uint8_t* d_payload, uint64_t bytes);

// Rank 0: sends `manifest`'s FULL version from `bytes` bytes of device
// memory at d_payload (this rank's device; complete: the stream that wrote
// it was synchronised). Refusals send nothing (FailedPrecondition or
// InvalidArgument, the group untouched): the group cannot broadcast device
// memory, `keys` is set (sealing needs host bytes), the manifest is not
// FULL (a DELTA's encoded payload is host bytes: BroadcastWeightSender),
// or its total_bytes or a bucket does not match `bytes`. Otherwise the
// group's errors.
absl::Status PublishDeviceOverBroadcast(
    BroadcastGroup* group, const v1::WeightManifest& manifest,
    const uint8_t* d_payload, uint64_t bytes,
    const DataPlaneKeyHolder* keys = nullptr);

// Checks the whole staged version (device bytes) before it may go live:
// typically the SHA-256 against a trusted digest. Any error rejects it.
using DeviceDigestCheck =
    std::function<absl::Status(const v1::WeightManifest& manifest,
                               const uint8_t* d_staging, uint64_t bytes)>;

// What the device receiver does to device memory besides broadcasting into
// it: CudaDeviceMemory() on the current CUDA device in production; a test
// substitutes host memory (DeviceReceiveOptions::memory_for_test) to run
// the receiver's protocol on the CPU.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // kernels::Crc32c of `n` bytes at d.
  virtual absl::StatusOr<uint32_t> Crc32c(const uint8_t* d, uint64_t n) = 0;
  // ApplyDeltaOnDevice (device_delta.h).
  virtual absl::Status ApplyDelta(absl::Span<const uint8_t> delta, uint8_t* d,
                                  uint64_t n) = 0;
  virtual absl::StatusOr<uint8_t*> Allocate(uint64_t n) = 0;
  virtual void Free(uint8_t* d) = 0;
};
DeviceMemory* CudaDeviceMemory();

struct DeviceReceiveOptions {
  // The version d_staging holds on entry (its base for a DELTA); empty: no
  // valid version (a DELTA is refused then).
  std::optional<uint64_t> staged_version;
  // Called after every bucket verified; null: CRC-32C only.
  DeviceDigestCheck digest_check;
  // Test-only: memory operations on host memory (see DeviceMemory). Null:
  // CudaDeviceMemory().
  DeviceMemory* memory_for_test = nullptr;
};

// A worker rank: joins every broadcast of the next version and receives it
// into `bytes` bytes of device memory at d_staging (this rank's device):
// the staging buffer of a double-buffered worker, whose swap stays a
// pointer swap, or in inplace mode the live weights themselves, whose
// readers stay paused until this returns OK.
// FULL: the buckets land in place; DELTA: the encoded delta arrives on the
// host, is decoded there (kernels::DecodeBf16DeltaOps, which validates it)
// and patched into d_staging on the device (ApplyDeltaOnDevice). Returns
// the verified version's manifest. `*round_version` is set as soon as the
// manifest arrived. Local failures (stale layout, bad CRC, sealed) still
// join every broadcast of the version, into device scratch, and are
// returned afterwards: DataLoss for a CRC mismatch naming the bucket,
// FailedPrecondition for what this rank cannot take. After any error the
// contents of d_staging are undefined (a DELTA may be half applied):
// it must not go live, and the next version it takes is a FULL one.
// FailedPrecondition at once, nothing joined, for a group that cannot
// broadcast device memory.
absl::StatusOr<v1::WeightManifest> ReceiveDeviceOverBroadcast(
    BroadcastGroup* group, uint8_t* d_staging, uint64_t bytes,
    uint64_t* round_version, const DeviceReceiveOptions& options = {});

}  // namespace tandem::weights
