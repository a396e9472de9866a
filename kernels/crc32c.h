#pragma once

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// weight buckets and pull-path chunks. Matches RFC 3720 (iSCSI) and
// absl::ComputeCrc32c / Google's crc32c library: Crc32c("123456789") ==
// 0xE3069283.
//
// The hardware path (SSE4.2 `crc32` instruction) is chosen at run time when
// the CPU has it; otherwise a portable slicing-by-8 table implementation
// runs. Both produce identical results. All functions are thread-safe.

#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

// CRC-32C of `size` bytes at `data`. `data` may be null when size == 0.
uint32_t Crc32c(const void* data, size_t size);

// Continues a CRC: Crc32cExtend(Crc32c(a), b) == Crc32c(a followed by b).
// Start from 0 for an empty prefix.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// The CRC-32C of a followed by b, from crc_a = Crc32c(a), crc_b = Crc32c(b)
// and b's length: lets two threads checksum the halves of one buffer.
// O(log size_b) carry-less multiplications, no pass over the bytes.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);

// The CRC-32C of a buffer of `total_bytes` cut into chunks of
// `chunk_bytes` (the last one shorter when they do not divide), from each
// chunk's own CRC-32C in order: how chunks checksummed in parallel (on a
// GPU: kernels/cuda/crc32c_cuda.h) are joined on the host. One
// multiplication by a fixed power of x per chunk, four table lookups from
// 256 chunks on. REQUIRES: chunk_bytes > 0 and
// num_chunks == ceil(total_bytes / chunk_bytes).
uint32_t Crc32cOfChunks(const uint32_t* chunk_crcs, size_t num_chunks,
                        uint64_t chunk_bytes, uint64_t total_bytes);

// Crc32cExtend with the bytes split across `threads` threads (this one and
// threads - 1 it starts and joins), each part's CRC combined in order. For
// a buffer that nothing else can overlap with; inputs under 4 MiB per
// thread run on this thread alone.
uint32_t Crc32cExtendParallel(uint32_t crc, const void* data, size_t size,
                              int threads);

// The portable implementation, exposed so tests can compare it with the
// hardware path on machines that have one.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

// True when Crc32c() uses the SSE4.2 instruction on this machine.
bool Crc32cHardwareAccelerated();

}  // namespace tandem::kernels
