#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/crc32c.h"
#include "kernels/cuda/crc32c_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(std::string(what) + ": " +
                             cudaGetErrorString(err));
}

// One thread per chunk: the byte-wise table for the unaligned head and
// tail, slicing-by-4 over 16-byte loads in between. Each block builds the
// four tables in shared memory (256 threads, one entry each).
__global__ void ChunkCrcs(const uint8_t* data, uint64_t bytes,
                          uint64_t chunk_bytes, uint64_t chunks,
                          uint32_t* crcs) {
  __shared__ uint32_t table[4][256];
  {
    uint32_t c = threadIdx.x;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1u)));
    table[0][threadIdx.x] = c;
  }
  __syncthreads();
  for (int t = 1; t < 4; ++t) {
    const uint32_t prev = table[t - 1][threadIdx.x];
    table[t][threadIdx.x] = (prev >> 8) ^ table[0][prev & 0xFF];
    __syncthreads();
  }
  const uint64_t chunk = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (chunk >= chunks) return;
  const uint64_t begin = chunk * chunk_bytes;
  const uint64_t end = min(bytes, begin + chunk_bytes);
  const uint8_t* p = data + begin;
  const uint8_t* stop = data + end;
  uint32_t crc = 0xFFFFFFFFu;
  auto byte = [&](uint8_t b) { crc = (crc >> 8) ^ table[0][(crc ^ b) & 0xFF]; };
  auto word = [&](uint32_t w) {
    crc ^= w;
    crc = table[3][crc & 0xFF] ^ table[2][(crc >> 8) & 0xFF] ^
          table[1][(crc >> 16) & 0xFF] ^ table[0][crc >> 24];
  };
  while (p < stop && reinterpret_cast<uintptr_t>(p) % 16 != 0) byte(*p++);
  for (; stop - p >= 16; p += 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    word(v.x);
    word(v.y);
    word(v.z);
    word(v.w);
  }
  while (p < stop) byte(*p++);
  crcs[chunk] = ~crc;
}

}  // namespace

absl::Status Crc32cChunks(const void* d_data, uint64_t bytes,
                          uint64_t chunk_bytes, uint32_t* d_chunk_crcs,
                          void* stream_ptr) {
  if (chunk_bytes == 0) {
    return absl::InvalidArgumentError("Crc32cChunks: chunk_bytes must be > 0");
  }
  if (bytes == 0) return absl::OkStatus();
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const uint64_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  const uint64_t blocks = (chunks + kThreads - 1) / kThreads;
  ChunkCrcs<<<blocks, kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(d_data), bytes, chunk_bytes, chunks,
      d_chunk_crcs);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return CudaError(e, "Crc32cChunks launch");
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return CudaError(e, "Crc32cChunks cudaStreamSynchronize");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Crc32cDevice(const void* d_data, uint64_t bytes,
                                      void* stream_ptr) {
  if (bytes == 0) return uint32_t{0};
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const uint64_t chunks = (bytes + kCrc32cChunkBytes - 1) / kCrc32cChunkBytes;
  uint32_t* d_crcs = nullptr;
  // Stream-ordered: unlike cudaMalloc/cudaFree, no device-wide
  // synchronisation with the kernels of other streams (the engine's).
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&d_crcs),
                                      chunks * sizeof(uint32_t), stream);
      e != cudaSuccess) {
    return CudaError(e, "Crc32cDevice cudaMallocAsync");
  }
  std::vector<uint32_t> crcs(chunks);
  auto run = [&]() -> absl::Status {
    if (absl::Status s =
            Crc32cChunks(d_data, bytes, kCrc32cChunkBytes, d_crcs, stream);
        !s.ok()) {
      return s;
    }
    if (cudaError_t e =
            cudaMemcpyAsync(crcs.data(), d_crcs, chunks * sizeof(uint32_t),
                            cudaMemcpyDeviceToHost, stream);
        e != cudaSuccess) {
      return CudaError(e, "Crc32cDevice cudaMemcpyAsync");
    }
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return CudaError(e, "Crc32cDevice cudaStreamSynchronize");
    }
    return absl::OkStatus();
  };
  const absl::Status status = run();
  cudaFreeAsync(d_crcs, stream);
  if (!status.ok()) return status;
  return Crc32cOfChunks(crcs.data(), crcs.size(), kCrc32cChunkBytes, bytes);
}

}  // namespace tandem::kernels::cuda
