#include "common/weights/flat_weight_layout.h"

#include <catch2/catch.hpp>
#include <random>

#include "absl/strings/str_format.h"
#include "kernels/crc32c.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

TEST_CASE("FlatWeightLayout aligns tensors and cuts fixed-size buckets",
          "[weights][layout]") {
  auto layout = FlatWeightLayout::Create(
      testing::SmallModelTensors(), {.bucket_bytes = 4096, .alignment = 64});
  REQUIRE(layout.ok());
  uint64_t end = 0;
  for (const TensorPlacement& t : layout->tensors()) {
    CHECK(t.offset % 64 == 0);
    CHECK(t.offset >= end);
    CHECK(t.bucket == t.offset / 4096);
    CHECK(t.offset_in_bucket == t.offset % 4096);
    end = t.offset + t.info.byte_size;
  }
  CHECK(layout->total_bytes() % 64 == 0);
  CHECK(layout->total_bytes() >= end);
  uint64_t covered = 0;
  for (const BucketRange& b : layout->buckets()) {
    CHECK(b.offset == covered);
    CHECK(b.size <= 4096);
    covered += b.size;
  }
  CHECK(covered == layout->total_bytes());
  // The 12 KiB up_proj tensor spans several buckets.
  const TensorPlacement* up = layout->Find("model.layers.0.mlp.up_proj.weight");
  REQUIRE(up != nullptr);
  CHECK((up->offset + up->info.byte_size - 1) / 4096 > up->bucket);
  CHECK(layout->Find("missing") == nullptr);
}

TEST_CASE("FlatWeightLayout rejects bad tensors and options",
          "[weights][layout]") {
  using Tensors = std::vector<TensorInfo>;
  CHECK_FALSE(
      FlatWeightLayout::Create(Tensors{{"a", v1::DTYPE_BF16, {2, 3}, 10}}, {})
          .ok());
  CHECK_FALSE(FlatWeightLayout::Create(Tensors{{"a", v1::DTYPE_BF16, {2}, 4},
                                               {"a", v1::DTYPE_BF16, {2}, 4}},
                                       {})
                  .ok());
  CHECK_FALSE(
      FlatWeightLayout::Create(Tensors{{"", v1::DTYPE_BF16, {2}, 4}}, {}).ok());
  CHECK_FALSE(FlatWeightLayout::Create(
                  Tensors{{"a", v1::DTYPE_UNSPECIFIED, {2}, 4}}, {})
                  .ok());
  CHECK_FALSE(
      FlatWeightLayout::Create(Tensors{{"a", v1::DTYPE_BF16, {-2}, 4}}, {})
          .ok());
  CHECK_FALSE(
      FlatWeightLayout::Create({}, {.bucket_bytes = 100, .alignment = 64})
          .ok());
  CHECK_FALSE(
      FlatWeightLayout::Create({}, {.bucket_bytes = 128, .alignment = 2}).ok());
  auto bad =
      FlatWeightLayout::Create(Tensors{{"w", v1::DTYPE_BF16, {2, 3}, 10}}, {});
  CHECK(std::string(bad.status().message()).find("w") != std::string::npos);
}

TEST_CASE("Manifest round trip rebuilds the same layout", "[weights][layout]") {
  std::mt19937_64 rng(1);
  auto layout = FlatWeightLayout::Create(
      testing::SmallModelTensors(), {.bucket_bytes = 4096, .alignment = 64});
  REQUIRE(layout.ok());
  WeightBuffer buf(layout->total_bytes());
  testing::FillRandom(*layout, &buf, rng);
  auto manifest = layout->BuildManifest(buf.span(), 7);
  REQUIRE(manifest.ok());
  CHECK(manifest->policy_version() == 7);
  CHECK(manifest->kind() == v1::WEIGHT_PAYLOAD_KIND_FULL);
  CHECK(manifest->buckets_size() == static_cast<int>(layout->num_buckets()));
  for (const auto& b : manifest->buckets()) {
    CHECK(b.crc32c() ==
          kernels::Crc32c(buf.data() + b.byte_offset(), b.byte_size()));
  }
  // Through the wire format and back.
  v1::WeightManifest parsed;
  REQUIRE(parsed.ParseFromString(manifest->SerializeAsString()));
  auto rebuilt = FlatWeightLayout::FromManifest(parsed);
  REQUIRE(rebuilt.ok());
  CHECK(layout->CheckSameLayout(parsed).ok());
  CHECK(rebuilt->CheckSameLayout(*manifest).ok());
  CHECK(rebuilt->total_bytes() == layout->total_bytes());
  REQUIRE(rebuilt->tensors().size() == layout->tensors().size());
  for (size_t i = 0; i < layout->tensors().size(); ++i) {
    CHECK(rebuilt->tensors()[i].offset == layout->tensors()[i].offset);
    CHECK(rebuilt->tensors()[i].info.shape == layout->tensors()[i].info.shape);
  }
  auto bytes = layout->TensorBytes(buf.span(), "model.norm.weight");
  REQUIRE(bytes.ok());
  CHECK(bytes->size() == 6);
  CHECK(VerifyWeights(*manifest, buf.span()).ok());

  // A manifest with an overlapping tensor or wrong bucket geometry fails.
  v1::WeightManifest broken = *manifest;
  broken.mutable_tensors(2)->set_offset_in_bucket(0);
  CHECK_FALSE(FlatWeightLayout::FromManifest(broken).ok());
  broken = *manifest;
  broken.mutable_buckets(0)->set_byte_size(1);
  CHECK_FALSE(FlatWeightLayout::FromManifest(broken).ok());
  broken = *manifest;
  broken.mutable_tensors(0)->set_name("other");
  CHECK_FALSE(layout->CheckSameLayout(broken).ok());
}

TEST_CASE("Verification names the corrupted bucket and both checksums",
          "[weights][layout]") {
  std::mt19937_64 rng(2);
  auto layout = FlatWeightLayout::Create(
      testing::SmallModelTensors(), {.bucket_bytes = 4096, .alignment = 64});
  REQUIRE(layout.ok());
  WeightBuffer buf(layout->total_bytes());
  testing::FillRandom(*layout, &buf, rng);
  auto manifest = layout->BuildManifest(buf.span(), 3);
  REQUIRE(manifest.ok());
  buf.data()[2 * 4096 + 17] ^= 0x40;
  absl::Status s = VerifyWeights(*manifest, buf.span());
  REQUIRE(s.code() == absl::StatusCode::kDataLoss);
  const std::string msg(s.message());
  INFO(msg);
  CHECK(msg.find("bucket 2") != std::string::npos);
  CHECK(msg.find(absl::StrFormat("expected 0x%08x",
                                 manifest->buckets(2).crc32c())) !=
        std::string::npos);
  CHECK(msg.find("got 0x") != std::string::npos);
  CHECK(VerifyBucket(*manifest, 1, buf.span().subspan(4096, 4096)).ok());
  CHECK(VerifyBucket(*manifest, 99, {}).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::weights
