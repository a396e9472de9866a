// The host tree digest (common/weights/tree_digest.h) against an
// independent reference: Python's hashlib computing the same tree from its
// definition (tests/unit/tree_digest_reference.py).

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "common/weights/tree_digest.h"
#include "common/weights/weight_digest.h"
#include "tests/unit/tree_digest_reference.h"

namespace tandem::weights {
namespace {

std::vector<uint8_t> RandomBytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// Sizes at and around the leaf (4096) and fan-in (128 leaves, 128 x 128
// leaves: a third level) edges, and several MiB.
std::vector<uint64_t> EdgeSizes() {
  const uint64_t group = kTreeFanout * kTreeLeafBytes;
  return {0,
          1,
          4095,
          4096,
          4097,
          2 * 4096,
          group - 1,
          group,
          group + 1,
          5 * group,
          kTreeFanout * group - 1,
          kTreeFanout * group + 1,
          (uint64_t{5} << 20) + 123};
}

TEST_CASE("The tree digest equals hashlib's tree at leaf and fan-in edges",
          "[weights][tree_digest]") {
  std::vector<std::vector<uint8_t>> buffers;
  for (uint64_t n : EdgeSizes()) buffers.push_back(RandomBytes(n, n));
  const std::vector<std::string> expected =
      testing::ReferenceDigests("tree", buffers);
  REQUIRE(expected.size() == buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    INFO(buffers[i].size() << " bytes");
    for (int threads : {1, 3}) {
      absl::StatusOr<std::string> root = WeightTreeSha256(buffers[i], threads);
      REQUIRE(root.ok());
      CHECK(DigestPrefixHex(*root, 32) == DigestPrefixHex(expected[i], 32));
    }
  }
}

TEST_CASE("The tree digest fed in pieces equals the digest of the whole",
          "[weights][tree_digest]") {
  const std::vector<uint8_t> bytes =
      RandomBytes(kTreeFanout * kTreeLeafBytes * 3 + 777, 9);
  absl::StatusOr<std::string> whole = WeightTreeSha256(bytes);
  REQUIRE(whole.ok());
  // Pieces that end inside leaves, on leaf edges, and empty ones.
  for (uint64_t piece : {uint64_t{1000}, uint64_t{4096}, uint64_t{4097},
                         uint64_t{3 * 4096 + 5}, uint64_t{1} << 20}) {
    INFO("pieces of " << piece << " bytes");
    TreeSha256Hasher hasher(2);
    for (uint64_t at = 0; at < bytes.size(); at += piece) {
      hasher.Update(
          {bytes.data() + at, std::min<size_t>(piece, bytes.size() - at)});
      hasher.Update({});
    }
    absl::StatusOr<std::string> root = hasher.Finish();
    REQUIRE(root.ok());
    CHECK(*root == *whole);
  }
}

TEST_CASE("A flipped byte or a missing last byte changes the tree root",
          "[weights][tree_digest]") {
  std::vector<uint8_t> bytes = RandomBytes(3 * kTreeLeafBytes + 10, 4);
  absl::StatusOr<std::string> good = WeightTreeSha256(bytes);
  REQUIRE(good.ok());
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, bytes.size() - 1}) {
    INFO("byte " << at);
    bytes[at] ^= 0x10;
    absl::StatusOr<std::string> flipped = WeightTreeSha256(bytes);
    bytes[at] ^= 0x10;
    REQUIRE(flipped.ok());
    CHECK(*flipped != *good);
    const absl::Status refused =
        CheckWeightTreeSha256(7, *good, *flipped, bytes.size());
    CHECK(IsDigestMismatch(refused));
    CHECK_THAT(std::string(refused.message()),
               Catch::Contains("weights v7 refused: tree sha256 mismatch"));
  }
  absl::StatusOr<std::string> shorter =
      WeightTreeSha256({bytes.data(), bytes.size() - 1});
  REQUIRE(shorter.ok());
  CHECK(*shorter != *good);
  CHECK(CheckWeightTreeSha256(7, *good, *good, bytes.size()).ok());
  CHECK(absl::IsInvalidArgument(
      CheckWeightTreeSha256(7, "short", *good, bytes.size())));
}

}  // namespace
}  // namespace tandem::weights
