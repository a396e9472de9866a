// GPU tests of the CUDA delta kernels. They pass trivially (with a warning)
// on machines without a CUDA device, so the build checks they compile.

#include "kernels/cuda/bf16_delta_cuda.h"

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"

namespace tandem::kernels {
namespace {

template <typename T>
T* ToDevice(const std::vector<T>& host, size_t capacity = 0) {
  T* d = nullptr;
  const size_t n = std::max(host.size(), capacity);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d),
                     std::max<size_t>(n, 1) * sizeof(T)) == cudaSuccess);
  if (!host.empty()) {
    REQUIRE(cudaMemcpy(d, host.data(), host.size() * sizeof(T),
                       cudaMemcpyHostToDevice) == cudaSuccess);
  }
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> host(n);
  if (n > 0) {
    REQUIRE(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
  }
  return host;
}

TEST_CASE("CUDA compaction and patch match the CPU delta bit for bit",
          "[cuda][delta]") {
  if (!cuda::DeviceAvailable()) {
    WARN("no CUDA device: skipping");
    return;
  }
  std::mt19937_64 rng(9);
  const size_t n = 1'000'003;
  std::vector<uint16_t> prev(n), next;
  for (auto& w : prev) w = static_cast<uint16_t>(rng());
  next = prev;
  for (auto& w : next) {
    if (rng() % 100 == 0) w = static_cast<uint16_t>(w + 1 + rng() % 3);
  }
  next[0] ^= 0x8000;
  next[n - 1] = 0x7FC3;

  uint16_t* d_prev = ToDevice(prev);
  uint16_t* d_next = ToDevice(next);
  uint64_t* d_idx = ToDevice(std::vector<uint64_t>{}, n);
  uint16_t* d_new = ToDevice(std::vector<uint16_t>{}, n);
  uint16_t* d_old = ToDevice(std::vector<uint16_t>{}, n);
  auto count =
      cuda::CompactChangedWords(d_prev, d_next, n, d_idx, d_new, d_old);
  REQUIRE(count.ok());
  std::vector<uint64_t> expected;
  FindChangedWords(prev, next, &expected);
  REQUIRE(*count == expected.size());
  const auto indices = ToHost(d_idx, *count);
  const auto new_words = ToHost(d_new, *count);
  const auto old_words = ToHost(d_old, *count);
  REQUIRE(indices == expected);

  // The GPU change list encodes to the same bytes as the CPU path.
  auto from_gpu = EncodeSparseDelta(n, indices, new_words, old_words);
  auto from_cpu = EncodeBf16Delta(prev, next);
  REQUIRE(from_gpu.ok());
  REQUIRE(from_cpu.ok());
  REQUIRE(*from_gpu == *from_cpu);

  // Patch the device copy of prev with the decoded ops.
  DeltaOps ops;
  REQUIRE(DecodeBf16DeltaOps(*from_cpu, n, &ops).ok());
  uint64_t* d_si = ToDevice(ops.set_index);
  uint16_t* d_sv = ToDevice(ops.set_value);
  uint64_t* d_ai = ToDevice(ops.add_index);
  uint16_t* d_av = ToDevice(ops.add_value);
  REQUIRE(cuda::ApplyPatch(d_prev, n, d_si, d_sv, ops.set_index.size(), d_ai,
                           d_av, ops.add_index.size())
              .ok());
  REQUIRE(ToHost(d_prev, n) == next);
  for (void* p : {static_cast<void*>(d_prev), static_cast<void*>(d_next),
                  static_cast<void*>(d_idx), static_cast<void*>(d_new),
                  static_cast<void*>(d_old), static_cast<void*>(d_si),
                  static_cast<void*>(d_sv), static_cast<void*>(d_ai),
                  static_cast<void*>(d_av)}) {
    cudaFree(p);
  }
}

}  // namespace
}  // namespace tandem::kernels
