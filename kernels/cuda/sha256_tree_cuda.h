#pragma once

// The tree digest of device memory (common/weights/tree_digest.h defines
// it; compiled only with TANDEM_ENABLE_CUDA): how a receiver whose staged
// weights are on the GPU checks them against the manifest's tree_sha256
// without copying them to the host. One thread per 4 KiB leaf, then one
// thread per node of each level above, all on the device; the host reads
// back the top digest (32 bytes) and hashes the root. SHA-256 is this
// project's own (kernels/cuda/sha256_core.h, FIPS 180-4), the same
// functions on the device and in Sha256TreeOnHost.
//
// Pointers named d_* are device pointers. Work and the temporary device
// memory (stream-ordered allocation, 32 bytes per leaf and per node: 8.1
// MiB for 1 GiB) go on `stream` (nullptr = the default stream), which is
// synchronised before returning.
// Thread-safe as far as the CUDA runtime is.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// The tree root (32 raw bytes) of `bytes` bytes of device memory at
// d_data. Internal naming the CUDA call that failed.
absl::StatusOr<std::string> Sha256TreeDevice(const void* d_data, uint64_t bytes,
                                             void* stream = nullptr);

// The same root computed on the host, one thread, by the functions the
// kernels run (kernels/cuda/sha256_core.h): for tests of that code on
// machines without a GPU. Never fails.
std::string Sha256TreeOnHost(const uint8_t* data, uint64_t bytes);

}  // namespace tandem::kernels::cuda
