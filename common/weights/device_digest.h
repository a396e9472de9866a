#pragma once

// The SHA-256 of weight bytes that live in a tensor on any device, so that a
// version received into device memory (CUDA IPC, NCCL into a device staging
// buffer) is checked against its manifest's digest before it can go live,
// like every other path (weight_digest.h).
//
// A CPU tensor is hashed where it is, piece by piece. A CUDA tensor is
// copied to the host through two pinned buffers of `piece_bytes` each: the
// copy of piece i + 1 runs on the device's current stream while the host
// hashes piece i, so the cost is about max(copy, hash) per piece rather
// than their sum, and host memory stays at 2 x piece_bytes whatever the
// model size. The device bytes are not changed.
//
// Thread-compatible; uses the calling thread's current stream of the
// tensor's device.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::weights {

inline constexpr int64_t kDeviceDigestPieceBytes = int64_t{16} << 20;

// SHA-256 (32 raw bytes) of the bytes of `bytes`: a contiguous tensor of
// any dtype and shape, hashed in memory order. InvalidArgument for a
// non-contiguous or undefined tensor or piece_bytes < 1; Internal when
// OpenSSL or the device copy fails.
absl::StatusOr<std::string> TensorSha256(
    const at::Tensor& bytes, int64_t piece_bytes = kDeviceDigestPieceBytes);

// OK when `expected` is the SHA-256 of `bytes` (VerifyWeightSha256's
// errors otherwise: DataLoss naming the version and both prefixes on a
// mismatch).
absl::Status VerifyTensorWeightSha256(
    uint64_t version, const std::string& expected, const at::Tensor& bytes,
    int64_t piece_bytes = kDeviceDigestPieceBytes);

}  // namespace tandem::weights
