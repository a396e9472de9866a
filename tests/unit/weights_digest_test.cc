// The SHA-256 check of a whole staged version (issue 25 item 3): what the
// per-bucket CRC-32C cannot catch, the digest from the authenticated
// manifest does.

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "common/weights/staging_weights.h"
#include "common/weights/weight_digest.h"
#include "common/weights/weight_transport.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

struct Version {
  WeightBuffer bytes;
  v1::WeightManifest manifest;
};

Version MakeVersion(const FlatWeightLayout& layout, uint64_t v, uint64_t seed) {
  Version out{WeightBuffer(layout.total_bytes()), {}};
  std::mt19937_64 rng(seed);
  testing::FillRandom(layout, &out.bytes, rng);
  auto manifest = layout.BuildManifest(out.bytes.span(), v);
  REQUIRE(manifest.ok());
  out.manifest = *std::move(manifest);
  return out;
}

class FixedDigest : public TrustedDigestSource {
 public:
  explicit FixedDigest(std::string sha256) : sha256_(std::move(sha256)) {}
  absl::StatusOr<std::string> TrustedSha256(uint64_t version) override {
    ++calls;
    return sha256_;
  }
  int calls = 0;

 private:
  std::string sha256_;
};

TEST_CASE("WeightSha256 is the SHA-256 of the bytes", "[weights][digest]") {
  const uint8_t abc[] = {'a', 'b', 'c'};
  auto d = WeightSha256(abc);
  REQUIRE(d.ok());
  CHECK(DigestPrefixHex(*d, 32) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("The manifest carries the SHA-256 of the whole flat buffer",
          "[weights][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Version v = MakeVersion(layout, 1, 7);
  auto expected = WeightSha256(v.bytes.span());
  REQUIRE(expected.ok());
  CHECK(v.manifest.sha256() == *expected);
}

TEST_CASE(
    "A tampered byte whose bucket CRC-32C still matches is refused by the "
    "digest, and live stays",
    "[weights][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  REQUIRE(layout.num_buckets() > 2);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  Version v1 = MakeVersion(layout, 1, 1);
  REQUIRE(StagePayload(&s, v1.manifest, v1.bytes.span()).ok());
  REQUIRE(s.Commit().ok());

  Version v2 = MakeVersion(layout, 2, 2);
  WeightBuffer tampered(layout.total_bytes());
  std::memcpy(tampered.data(), v2.bytes.data(), tampered.size());
  const BucketRange& b = layout.buckets()[2];
  REQUIRE(testing::FlipKeepingCrc32c(
              tampered.span().subspan(b.offset, b.size), 8) > 0);
  REQUIRE(std::memcmp(tampered.data(), v2.bytes.data(), tampered.size()) != 0);
  // Every bucket's CRC still matches the manifest: only the digest sees it.
  REQUIRE(VerifyWeights(v2.manifest, tampered.span()).ok());

  absl::Status st = StagePayload(&s, v2.manifest, tampered.span());
  CHECK(IsDigestMismatch(st));
  CHECK(std::string(st.message()).find("weights v2") != std::string::npos);
  CHECK_FALSE(s.ready());
  CHECK_FALSE(s.Commit().ok());
  CHECK(s.live().version == 1u);
  CHECK(s.stats().digest_mismatches == 1);
  CHECK(s.stats().rejected_versions == 1);

  // The untouched bytes of the same version then go live.
  REQUIRE(StagePayload(&s, v2.manifest, v2.bytes.span()).ok());
  REQUIRE(s.Commit().ok());
  CHECK(s.live().version == 2u);
}

TEST_CASE("A delta whose result differs from the manifest's digest is refused",
          "[weights][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  Version v1 = MakeVersion(layout, 1, 1);
  REQUIRE(StagePayload(&s, v1.manifest, v1.bytes.span()).ok());
  REQUIRE(s.Commit().ok());

  WeightBuffer next(layout.total_bytes());
  std::memcpy(next.data(), v1.bytes.data(), next.size());
  std::mt19937_64 rng(3);
  testing::Perturb(layout, &next, rng, 0.01);
  auto manifest = layout.BuildManifest(next.span(), 2);
  REQUIRE(manifest.ok());
  manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
  manifest->set_base_version(1);
  auto delta = kernels::EncodeBf16Delta(kernels::AsWords(v1.bytes.span()),
                                        kernels::AsWords(next.span()));
  REQUIRE(delta.ok());

  // The delta is right but the digest says otherwise: refused.
  v1::WeightManifest wrong = *manifest;
  std::string d = wrong.sha256();
  d[0] ^= 1;
  wrong.set_sha256(d);
  CHECK(IsDigestMismatch(StagePayload(&s, wrong, *delta)));
  CHECK(s.live().version == 1u);
  CHECK(s.stats().digest_mismatches == 1);
  // The real manifest: committed.
  REQUIRE(StagePayload(&s, *manifest, *delta).ok());
  REQUIRE(s.Commit().ok());
  CHECK(s.live().version == 2u);
}

TEST_CASE(
    "With a trusted digest source the in-band manifest's digest is not "
    "believed",
    "[weights][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  Version real = MakeVersion(layout, 1, 1);
  // An attacker's version with a self-consistent manifest (CRCs and digest
  // of its own bytes), as it could send over a pair socket.
  Version forged = MakeVersion(layout, 1, 99);
  FixedDigest trusted(real.manifest.sha256());

  absl::Status st = s.Begin(forged.manifest, &trusted);
  REQUIRE(st.ok());
  for (const BucketRange& b : layout.buckets()) {
    REQUIRE(s.WriteBucketChunk(b.index, 0,
                               forged.bytes.span().subspan(b.offset, b.size))
                .ok());
    st = s.FinishBucket(b.index);
  }
  CHECK(IsDigestMismatch(st));
  CHECK(trusted.calls == 1);
  CHECK_FALSE(s.live().version.has_value());

  REQUIRE(s.Begin(real.manifest, &trusted).ok());
  for (const BucketRange& b : layout.buckets()) {
    REQUIRE(s.WriteBucketChunk(b.index, 0,
                               real.bytes.span().subspan(b.offset, b.size))
                .ok());
    REQUIRE(s.FinishBucket(b.index).ok());
  }
  REQUIRE(s.Commit().ok());
  CHECK(s.live().version == 1u);
}

TEST_CASE("A manifest without a digest (an older trainer) still commits, counted",
          "[weights][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  Version v = MakeVersion(layout, 1, 1);
  v.manifest.clear_sha256();
  REQUIRE(StagePayload(&s, v.manifest, v.bytes.span()).ok());
  REQUIRE(s.Commit().ok());
  CHECK(s.stats().unsigned_versions == 1);
  CHECK(s.stats().digest_mismatches == 0);
}

}  // namespace
}  // namespace tandem::weights
