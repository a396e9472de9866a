#pragma once

// CRC-32C of device memory (compiled only with TANDEM_ENABLE_CUDA): how a
// receiver whose staging buffer is on the GPU verifies a bucket against its
// manifest without copying it to the host. The device checksums
// fixed-size chunks in parallel, one thread per chunk; the host joins the
// chunk CRCs in order with kernels::Crc32cOfChunks (kernels/crc32c.h), so
// the result equals kernels::Crc32c of the same bytes.
//
// Pointers named d_* are device pointers. Work, and the temporary device
// memory (stream-ordered allocation: no device-wide synchronisation), go
// on `stream` (nullptr = the default stream), which is synchronised before
// returning.
// Thread-safe as far as the CUDA runtime is.

#include <cstdint>

#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// Bytes per chunk of Crc32cDevice: 4 KiB gives a 1 GiB bucket 262144
// threads (every SM busy) and its host join 262144 steps of four table
// lookups each (Crc32cOfChunks).
inline constexpr uint64_t kCrc32cChunkBytes = 4096;

// d_chunk_crcs[i] = Crc32c of bytes [i * chunk_bytes, min((i + 1) *
// chunk_bytes, bytes)) of d_data, for i < ceil(bytes / chunk_bytes).
// InvalidArgument for chunk_bytes == 0.
absl::Status Crc32cChunks(const void* d_data, uint64_t bytes,
                          uint64_t chunk_bytes, uint32_t* d_chunk_crcs,
                          void* stream = nullptr);

// kernels::Crc32c of `bytes` bytes of device memory at d_data: Crc32cChunks
// into a temporary buffer, the chunk CRCs copied to the host and joined.
absl::StatusOr<uint32_t> Crc32cDevice(const void* d_data, uint64_t bytes,
                                      void* stream = nullptr);

}  // namespace tandem::kernels::cuda
