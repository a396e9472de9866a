#pragma once

// Going live from device memory (issue 22 item 4): a version whose flat
// bytes sit in a device staging buffer (CUDA IPC's device copy, a
// broadcast received into device staging) is verified THERE and becomes
// the live weights as tensor views into that buffer, with no host copy of
// the weights. The same checks as StagingWeights' host path, in the same
// order, and nothing is returned before all of them passed:
//
//   1. the manifest matches the layout (same tensors and buckets);
//   2. CRC-32C of every bucket against the manifest (on the device through
//      the caller's BucketCrc32c, e.g. DeviceMemory::Crc32c of
//      device_broadcast.h; the host kernels::Crc32c for a CPU tensor);
//   3. every float tensor (F32, BF16, F16) finite (torch isfinite on the
//      tensor's device, one host read of the result for the whole version;
//      for a CPU tensor the host path's bit-pattern scan); refused exactly
//      as the host path refuses (finite_weights.h);
//   4. the digest of the whole buffer against the trusted one: on a CUDA
//      tensor with a trusted tree root and a device tree function, the
//      tree digest on the device (tree_digest.h; one thread per 4 KiB
//      leaf, no host copy); else the plain SHA-256 (TensorSha256: pinned
//      host pieces of 16 MiB, never the whole model). GoLiveDigest below.
//
// The buffer is a contiguous uint8 tensor of layout.total_bytes() bytes on
// any device, so the same code runs on the CPU in tests. The views hold a
// reference to its storage: the buffer lives as long as the live weights,
// and the caller must receive the next version into ANOTHER buffer (a
// pointer swap at the step boundary, as for the host double buffer).
//
// Sealed (mtls) versions do not come here: AES-GCM opens host bytes, so
// they stay on the host path.
//
// Thread-compatible; device work runs on the calling thread's current
// stream of the tensor's device.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/weights/device_digest.h"
#include "common/weights/finite_weights.h"
#include "common/weights/flat_weight_layout.h"
#include "tandem/v1/common.pb.h"

namespace tandem::model {
struct ModelConfig;
class ModelWeights;
}  // namespace tandem::model

namespace tandem::weights {

struct StagedIpcCopy;  // cuda_ipc.h

// kernels::Crc32c of `n` bytes at `d` (memory of the staged tensor's
// device).
using BucketCrc32c =
    std::function<absl::StatusOr<uint32_t>(const uint8_t* d, uint64_t n)>;

// Which finite check VerifyStagedTensor runs (check 3 above).
enum class FiniteCheck { kAuto, kBitScan, kTorch };

// The tree root (tree_digest.h, 32 raw bytes) of `n` bytes at `d` (memory
// of the staged tensor's device), e.g. kernels::cuda::Sha256TreeDevice.
using TreeSha256Fn =
    std::function<absl::StatusOr<std::string>(const uint8_t* d, uint64_t n)>;

// Which digest step 4 checks.
enum class GoLiveDigest {
  // The tree root when there is one, the tensor is on a CUDA device and
  // tree_sha256 is set (the device kernel); else the plain SHA-256 when
  // there is one; else the tree root when there is one (host tree for a
  // CPU tensor); else none.
  kAuto,
  // The tree root only, wherever the tensor is (the host TreeSha256Hasher
  // for a CPU tensor): how CPU tests cover the tree check a CUDA worker
  // runs. FailedPrecondition when there is no expected tree root.
  kTree,
  // The plain SHA-256 only (when there is one).
  kSha256,
};

struct DeviceGoLiveOptions {
  // Null: the host kernels::Crc32c (REQUIRES a CPU tensor; a CUDA tensor
  // without it is refused with FailedPrecondition).
  BucketCrc32c crc32c;
  // The trusted SHA-256 (32 raw bytes) of the version; empty: the version
  // is unsigned (a trainer that predates digests) and is checked by CRC-32C
  // and the finite check only, as on the host path.
  std::string expected_sha256;
  // The trusted tree root (WeightManifest.tree_sha256 of a manifest that
  // came over gRPC); empty: none.
  std::string expected_tree_sha256;
  // The device tree digest; null: the host one (REQUIRES a CPU tensor when
  // the tree is checked).
  TreeSha256Fn tree_sha256;
  GoLiveDigest digest = GoLiveDigest::kAuto;
  int64_t piece_bytes = kDeviceDigestPieceBytes;
  // How check 3 reads the values. kAuto: torch isfinite for a tensor on a
  // device, the host bit-pattern scan for a CPU tensor. kTorch runs torch
  // isfinite on a CPU tensor too (tests cover the code a CUDA worker runs
  // that way). kBitScan REQUIRES a CPU tensor (FailedPrecondition
  // otherwise). All three refuse alike (finite_weights.h).
  FiniteCheck finite_check = FiniteCheck::kAuto;
};

// Checks 1-4 above on `staged`. Errors name the version and what failed:
// FailedPrecondition (layout, missing CRC function), InvalidArgument (a
// tensor that is not a contiguous uint8 buffer of the layout's size),
// DataLoss for a CRC mismatch ("bucket N"), a digest mismatch
// (IsDigestMismatch) or a non-finite value (finite_weights.h's refusal,
// IsNonFiniteWeights).
absl::Status VerifyStagedTensor(const v1::WeightManifest& manifest,
                                const FlatWeightLayout& layout,
                                const at::Tensor& staged,
                                const DeviceGoLiveOptions& options);

// ModelWeights for `config` whose tensors are views into `staged` (same
// device, the config's dtype), holding its storage. No check of the bytes:
// call after VerifyStagedTensor.
absl::StatusOr<std::shared_ptr<model::ModelWeights>> ViewStagedTensor(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    const at::Tensor& staged);

// VerifyStagedTensor, then ViewStagedTensor: the weights to stage for the
// engine's swap, or the reason the version may not go live (nothing is
// returned before every check passed).
absl::StatusOr<std::shared_ptr<model::ModelWeights>> GoLiveFromStagedTensor(
    const model::ModelConfig& config, const v1::WeightManifest& manifest,
    const FlatWeightLayout& layout, const at::Tensor& staged,
    const DeviceGoLiveOptions& options);

// A contiguous uint8 tensor over a CUDA IPC sink's handed-over copy
// (cuda_ipc.h), on its device (the CPU for a host-memory stand-in), that
// holds the copy alive: views of it (the live weights) keep it until the
// last one is dropped. Internal when the tensor cannot be made.
absl::StatusOr<at::Tensor> StagedCopyTensor(const StagedIpcCopy& copy);

}  // namespace tandem::weights
