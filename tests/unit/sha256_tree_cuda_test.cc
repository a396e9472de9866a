// The tree digest's CUDA code (kernels/cuda/sha256_tree_cuda.h,
// sha256_core.h). Its SHA-256 and tree are checked on the CPU against
// Python's hashlib (tests/unit/tree_digest_reference.py) on every machine;
// the device kernels against that host run of the same code where a CUDA
// device is (they pass with a warning elsewhere; tests/gpu/run.sh runs
// them on a GPU).

#include "kernels/cuda/sha256_tree_cuda.h"

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "kernels/cuda/bf16_delta_cuda.h"
#include "kernels/cuda/sha256_core.h"
#include "tests/unit/tree_digest_reference.h"

namespace tandem::kernels {
namespace {

std::vector<uint8_t> RandomBytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

std::string Hex(const std::string& digest) {
  return absl::BytesToHexString(digest);
}

std::vector<uint64_t> EdgeSizes() {
  const uint64_t group = sha256::kTreeFanout * sha256::kTreeLeafBytes;
  return {0,         1,     4095,      4096,          4097,
          group - 1, group, group + 1, 3 * group + 5, (uint64_t{5} << 20) + 3};
}

TEST_CASE("The kernels' SHA-256 run on the CPU equals hashlib's",
          "[cuda][sha256]") {
  if (testing::TreeDigestReferenceScript().empty()) {
    WARN("no tree_digest_reference.py beside this binary: skipping");
    return;
  }
  // Messages of 1..300 bytes: HashWithSuffix(m[0..n-1), m[n-1]) is the
  // SHA-256 of m, across the one- and two-block tails and whole blocks;
  // every length at an odd start too (the unaligned loads).
  std::vector<std::vector<uint8_t>> messages;
  for (uint64_t n = 1; n <= 300; ++n) messages.push_back(RandomBytes(n, n));
  const std::vector<std::string> expected =
      testing::ReferenceDigests("sha256", messages);
  REQUIRE(expected.size() == messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::vector<uint8_t>& m = messages[i];
    INFO(m.size() << " bytes");
    std::vector<uint8_t> shifted(m.size() + 1);
    std::copy(m.begin(), m.end(), shifted.begin() + 1);
    for (const uint8_t* at :
         {m.data(), static_cast<const uint8_t*>(shifted.data() + 1)}) {
      uint8_t out[32];
      sha256::HashWithSuffix(at, m.size() - 1, m.back(), out);
      CHECK(Hex(std::string(reinterpret_cast<char*>(out), 32)) ==
            Hex(expected[i]));
    }
  }
}

TEST_CASE("The kernels' tree run on the CPU equals hashlib's tree",
          "[cuda][sha256]") {
  if (testing::TreeDigestReferenceScript().empty()) {
    WARN("no tree_digest_reference.py beside this binary: skipping");
    return;
  }
  std::vector<std::vector<uint8_t>> buffers;
  for (uint64_t n : EdgeSizes()) buffers.push_back(RandomBytes(n, n + 1));
  const std::vector<std::string> expected =
      testing::ReferenceDigests("tree", buffers);
  REQUIRE(expected.size() == buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    INFO(buffers[i].size() << " bytes");
    CHECK(Hex(cuda::Sha256TreeOnHost(buffers[i].data(), buffers[i].size())) ==
          Hex(expected[i]));
  }
}

TEST_CASE("The device tree digest equals the same tree on the host",
          "[cuda][sha256]") {
  if (!cuda::DeviceAvailable()) {
    WARN("no CUDA device: skipping");
    return;
  }
  const std::vector<uint8_t> host =
      RandomBytes((uint64_t{64} << 20) + 4099 + 17, 5);
  uint8_t* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), host.size()) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  std::vector<uint64_t> sizes = EdgeSizes();
  sizes.push_back(uint64_t{64} << 20);  // 16384 leaves: three levels
  // Aligned and unaligned starts (the word and the byte loads).
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{4099}}) {
    for (uint64_t n : sizes) {
      INFO("offset " << offset << ", " << n << " bytes");
      absl::StatusOr<std::string> root = cuda::Sha256TreeDevice(d + offset, n);
      REQUIRE(root.ok());
      CHECK(Hex(*root) == Hex(cuda::Sha256TreeOnHost(host.data() + offset, n)));
    }
  }
  // A flipped byte changes it.
  absl::StatusOr<std::string> good = cuda::Sha256TreeDevice(d, host.size());
  REQUIRE(good.ok());
  const uint8_t flipped = host[777777] ^ 1;
  REQUIRE(cudaMemcpy(d + 777777, &flipped, 1, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  absl::StatusOr<std::string> bad = cuda::Sha256TreeDevice(d, host.size());
  REQUIRE(bad.ok());
  CHECK(*bad != *good);
  cudaFree(d);
}

}  // namespace
}  // namespace tandem::kernels
