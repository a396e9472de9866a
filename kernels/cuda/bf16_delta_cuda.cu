#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <string>

#include "kernels/cuda/bf16_delta_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWordsPerThread = 16;
constexpr uint64_t kWordsPerTile = uint64_t{kThreads} * kWordsPerThread;

absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(std::string(what) + ": " +
                             cudaGetErrorString(err));
}

#define TANDEM_CUDA_RETURN_IF_ERROR(expr, what) \
  do {                                          \
    cudaError_t tandem_err_ = (expr);           \
    if (tandem_err_ != cudaSuccess) {           \
      return CudaError(tandem_err_, what);      \
    }                                           \
  } while (false)

// Bitmask (bit j = word j of this thread's run) of changed words.
__device__ uint32_t ChangeMask(const uint16_t* prev, const uint16_t* next,
                               uint64_t n, uint64_t first) {
  uint32_t mask = 0;
  for (int j = 0; j < kWordsPerThread; ++j) {
    const uint64_t i = first + j;
    if (i < n && prev[i] != next[i]) mask |= 1u << j;
  }
  return mask;
}

__global__ void CountTiles(const uint16_t* prev, const uint16_t* next,
                           uint64_t n, uint64_t* tile_counts) {
  using BlockScan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  const uint64_t first =
      blockIdx.x * kWordsPerTile + uint64_t{threadIdx.x} * kWordsPerThread;
  const uint32_t count = __popc(ChangeMask(prev, next, n, first));
  uint32_t offset, total;
  BlockScan(temp).ExclusiveSum(count, offset, total);
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

__global__ void ScatterTiles(const uint16_t* prev, const uint16_t* next,
                             uint64_t n, const uint64_t* tile_offsets,
                             uint64_t* indices, uint16_t* new_words,
                             uint16_t* old_words) {
  using BlockScan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  const uint64_t first =
      blockIdx.x * kWordsPerTile + uint64_t{threadIdx.x} * kWordsPerThread;
  uint32_t mask = ChangeMask(prev, next, n, first);
  uint32_t offset;
  BlockScan(temp).ExclusiveSum(static_cast<uint32_t>(__popc(mask)), offset);
  uint64_t out = tile_offsets[blockIdx.x] + offset;
  while (mask != 0) {
    const int j = __ffs(mask) - 1;
    mask &= mask - 1;
    const uint64_t i = first + j;
    indices[out] = i;
    new_words[out] = next[i];
    if (old_words != nullptr) old_words[out] = prev[i];
    ++out;
  }
}

__global__ void SetWords(uint16_t* words, uint64_t num_words,
                         const uint64_t* index, const uint16_t* value,
                         uint64_t count) {
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i < count && index[i] < num_words) words[index[i]] = value[i];
}

__global__ void AddWords(uint16_t* words, uint64_t num_words,
                         const uint64_t* index, const uint16_t* value,
                         uint64_t count) {
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i < count && index[i] < num_words) {
    words[index[i]] = static_cast<uint16_t>(words[index[i]] + value[i]);
  }
}

}  // namespace

bool DeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

DeviceScratch::~DeviceScratch() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::StatusOr<void*> DeviceScratch::Get(uint64_t bytes) {
  int device = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  if (data_ != nullptr && bytes <= capacity_ && device == device_) {
    return data_;
  }
  if (data_ != nullptr) {
    // Unified addressing: cudaFree finds the device it was allocated on.
    cudaFree(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  const uint64_t size = bytes == 0 ? 1 : bytes;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&data_, size), "cudaMalloc");
  ++allocations_;
  capacity_ = size;
  device_ = device;
  return data_;
}

absl::StatusOr<uint64_t> CompactChangedWords(const uint16_t* d_prev,
                                             const uint16_t* d_next, uint64_t n,
                                             uint64_t* d_indices,
                                             uint16_t* d_new, uint16_t* d_old,
                                             void* stream_ptr,
                                             CompactScratch* scratch) {
  if (n == 0) return uint64_t{0};
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const uint64_t tiles = (n + kWordsPerTile - 1) / kWordsPerTile;
  // Without the caller's scratch: one for this call, freed on return.
  CompactScratch own;
  CompactScratch& use = scratch != nullptr ? *scratch : own;
  absl::StatusOr<void*> counts = use.counts.Get(tiles * 8);
  if (!counts.ok()) return counts.status();
  absl::StatusOr<void*> offsets = use.offsets.Get(tiles * 8);
  if (!offsets.ok()) return offsets.status();
  auto* d_counts = static_cast<uint64_t*>(*counts);
  auto* d_offsets = static_cast<uint64_t*>(*offsets);
  CountTiles<<<tiles, kThreads, 0, stream>>>(d_prev, d_next, n, d_counts);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "CountTiles launch");
  size_t temp_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, d_counts, d_offsets,
                                    static_cast<int>(tiles), stream),
      "DeviceScan size");
  absl::StatusOr<void*> temp = use.temp.Get(temp_bytes);
  if (!temp.ok()) return temp.status();
  TANDEM_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::ExclusiveSum(*temp, temp_bytes, d_counts, d_offsets,
                                    static_cast<int>(tiles), stream),
      "DeviceScan");
  ScatterTiles<<<tiles, kThreads, 0, stream>>>(d_prev, d_next, n, d_offsets,
                                               d_indices, d_new, d_old);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "ScatterTiles launch");
  uint64_t last_offset = 0, last_count = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&last_offset, d_offsets + tiles - 1, 8,
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpy");
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&last_count, d_counts + tiles - 1, 8,
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpy");
  // Also what makes `scratch` free for the next call.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream),
                              "cudaStreamSynchronize");
  return last_offset + last_count;
}

absl::Status ApplyPatch(uint16_t* d_words, uint64_t num_words,
                        const uint64_t* d_set_index,
                        const uint16_t* d_set_value, uint64_t num_set,
                        const uint64_t* d_add_index,
                        const uint16_t* d_add_value, uint64_t num_add,
                        void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (num_set > 0) {
    SetWords<<<(num_set + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        d_words, num_words, d_set_index, d_set_value, num_set);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "SetWords launch");
  }
  if (num_add > 0) {
    AddWords<<<(num_add + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        d_words, num_words, d_add_index, d_add_value, num_add);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "AddWords launch");
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream),
                              "cudaStreamSynchronize");
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
