// GPU tests of the device CRC-32C (kernels/cuda/crc32c_cuda.h). They pass
// with a warning on machines without a CUDA device, so the build checks
// they compile; tests/gpu/run.sh runs them where a GPU is.

#include "kernels/cuda/crc32c_cuda.h"

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "kernels/crc32c.h"
#include "kernels/cuda/bf16_delta_cuda.h"

namespace tandem::kernels {
namespace {

TEST_CASE("The device CRC-32C equals the host CRC-32C of the same bytes",
          "[cuda][crc32c]") {
  if (!cuda::DeviceAvailable()) {
    WARN("no CUDA device: skipping");
    return;
  }
  std::mt19937_64 rng(3);
  std::vector<uint8_t> host((uint64_t{8} << 20) + 37);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  uint8_t* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), host.size()) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  // Unaligned starts and lengths that are not a whole number of chunks.
  for (uint64_t offset :
       {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{16}, uint64_t{4099}}) {
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{15}, uint64_t{4096},
                       uint64_t{4097}, uint64_t{1} << 20, host.size() - 4099}) {
      INFO("offset " << offset << ", " << n << " bytes");
      auto crc = cuda::Crc32cDevice(d + offset, n);
      REQUIRE(crc.ok());
      CHECK(*crc == Crc32c(host.data() + offset, n));
    }
  }
  // A flipped bit changes it.
  host[12345] ^= 4;
  REQUIRE(cudaMemcpy(d + 12345, host.data() + 12345, 1,
                     cudaMemcpyHostToDevice) == cudaSuccess);
  auto crc = cuda::Crc32cDevice(d, host.size());
  REQUIRE(crc.ok());
  CHECK(*crc == Crc32c(host.data(), host.size()));
  cudaFree(d);
}

}  // namespace
}  // namespace tandem::kernels
