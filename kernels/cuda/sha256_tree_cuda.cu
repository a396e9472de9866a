#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/sha256_core.h"
#include "kernels/cuda/sha256_tree_cuda.h"

namespace tandem::kernels::cuda {
namespace {

namespace sha = ::tandem::kernels::sha256;

constexpr int kThreads = 128;

absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(std::string("Sha256TreeDevice: ") + what + ": " +
                             cudaGetErrorString(err));
}

__global__ void LeafDigests(const uint8_t* data, uint64_t bytes,
                            uint64_t leaves, uint8_t* digests) {
  const uint64_t leaf = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (leaf >= leaves) return;
  sha::TreeLeaf(data, bytes, leaf, digests + leaf * sha::kDigestBytes);
}

__global__ void NodeDigests(const uint8_t* children, uint64_t count,
                            uint64_t nodes, uint8_t* digests) {
  const uint64_t node = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (node >= nodes) return;
  sha::TreeNode(children, count, node, digests + node * sha::kDigestBytes);
}

uint64_t Blocks(uint64_t threads) {
  return (threads + kThreads - 1) / kThreads;
}

}  // namespace

absl::StatusOr<std::string> Sha256TreeDevice(const void* d_data, uint64_t bytes,
                                             void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const uint64_t leaves = sha::TreeLeafCount(bytes);
  const uint64_t parents = sha::TreeParentCount(leaves);
  // Two regions, ping-pong: the leaves' level, then each level above into
  // the region the level below does not use (every level above the leaves
  // fits in the `parents` digests of the smaller region).
  uint8_t* d_digests = nullptr;
  if (cudaError_t e =
          cudaMallocAsync(reinterpret_cast<void**>(&d_digests),
                          (leaves + parents) * sha::kDigestBytes, stream);
      e != cudaSuccess) {
    return CudaError(e, "cudaMallocAsync");
  }
  uint8_t top[sha::kDigestBytes];
  auto run = [&]() -> absl::Status {
    uint8_t* below = d_digests;
    uint8_t* above = d_digests + leaves * sha::kDigestBytes;
    LeafDigests<<<Blocks(leaves), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(d_data), bytes, leaves, below);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      return CudaError(e, "leaf kernel launch");
    }
    for (uint64_t count = leaves; count > 1;) {
      const uint64_t nodes = sha::TreeParentCount(count);
      NodeDigests<<<Blocks(nodes), kThreads, 0, stream>>>(below, count, nodes,
                                                          above);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
        return CudaError(e, "node kernel launch");
      }
      std::swap(below, above);
      count = nodes;
    }
    if (cudaError_t e = cudaMemcpyAsync(top, below, sha::kDigestBytes,
                                        cudaMemcpyDeviceToHost, stream);
        e != cudaSuccess) {
      return CudaError(e, "cudaMemcpyAsync");
    }
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return CudaError(e, "cudaStreamSynchronize");
    }
    return absl::OkStatus();
  };
  const absl::Status status = run();
  cudaFreeAsync(d_digests, stream);
  if (!status.ok()) return status;
  uint8_t root[sha::kDigestBytes];
  sha::TreeRoot(top, bytes, root);
  return std::string(reinterpret_cast<const char*>(root), sizeof(root));
}

std::string Sha256TreeOnHost(const uint8_t* data, uint64_t bytes) {
  uint64_t count = sha::TreeLeafCount(bytes);
  std::vector<uint8_t> level(count * sha::kDigestBytes);
  for (uint64_t i = 0; i < count; ++i) {
    sha::TreeLeaf(data, bytes, i, level.data() + i * sha::kDigestBytes);
  }
  while (count > 1) {
    const uint64_t nodes = sha::TreeParentCount(count);
    std::vector<uint8_t> above(nodes * sha::kDigestBytes);
    for (uint64_t j = 0; j < nodes; ++j) {
      sha::TreeNode(level.data(), count, j,
                    above.data() + j * sha::kDigestBytes);
    }
    level.swap(above);
    count = nodes;
  }
  uint8_t root[sha::kDigestBytes];
  sha::TreeRoot(level.data(), bytes, root);
  return std::string(reinterpret_cast<const char*>(root), sizeof(root));
}

}  // namespace tandem::kernels::cuda
