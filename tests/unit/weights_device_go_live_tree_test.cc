// Step 4 of going live from a staged tensor (common/weights/device_go_live.h)
// with the tree digest (tree_digest.h), run on the CPU: GoLiveDigest::kTree
// makes a CPU tensor take the tree check a CUDA worker runs on the device
// (the tree function seam is the one the worker fills with
// kernels::cuda::Sha256TreeDevice). The GPU cases are in tests/gpu.

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <string>

#include "common/model/model_weights.h"
#include "common/weights/device_go_live.h"
#include "common/weights/model_flattening.h"
#include "common/weights/tree_digest.h"
#include "common/weights/weight_digest.h"
#include "kernels/crc32c.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

struct Staged {
  FlatWeightLayout layout;
  v1::WeightManifest manifest;  // with sha256 and tree_sha256
  at::Tensor bytes;
};

Staged StageVersion(const model::ModelConfig& config, uint64_t v) {
  auto weights = model::RandomInit(config, static_cast<int>(200 + v));
  REQUIRE(weights.ok());
  LayoutOptions layout_options;
  layout_options.bucket_bytes = 64 << 10;
  auto layout = LayoutForModel(**weights, layout_options);
  REQUIRE(layout.ok());
  auto flat = FlattenModel(**weights, *layout);
  REQUIRE(flat.ok());
  auto manifest = layout->BuildManifest(**flat, v);
  REQUIRE(manifest.ok());
  auto tree = WeightTreeSha256(**flat);
  REQUIRE(tree.ok());
  manifest->set_tree_sha256(*tree);
  at::Tensor bytes = at::empty({static_cast<int64_t>((*flat)->size())},
                               at::TensorOptions(at::kByte));
  std::memcpy(bytes.data_ptr(), (*flat)->data(), (*flat)->size());
  return {*std::move(layout), *std::move(manifest), bytes};
}

DeviceGoLiveOptions TreeOptions(const v1::WeightManifest& manifest) {
  DeviceGoLiveOptions options;
  options.expected_sha256 = manifest.sha256();
  options.expected_tree_sha256 = manifest.tree_sha256();
  options.digest = GoLiveDigest::kTree;
  return options;
}

// Flips the lowest mantissa bit of the first weight (still finite) and
// reseals the bucket CRCs, so that only the digest can catch it.
void FlipFirstByte(Staged* staged) {
  auto* base = static_cast<uint8_t*>(staged->bytes.data_ptr());
  base[0] ^= 0x01;
  for (v1::BucketSpec& b : *staged->manifest.mutable_buckets()) {
    b.set_crc32c(kernels::Crc32c(base + b.byte_offset(), b.byte_size()));
  }
}

TEST_CASE("the tree digest accepts a good version and refuses a flipped byte",
          "[weights][device][tree_digest]") {
  for (model::WeightDType dtype :
       {model::WeightDType::kFloat32, model::WeightDType::kBFloat16}) {
    model::ModelConfig config = model::testing::TinyQwen2Config();
    config.dtype = dtype;
    Staged staged = StageVersion(config, 3);
    const DeviceGoLiveOptions options = TreeOptions(staged.manifest);
    auto live = GoLiveFromStagedTensor(config, staged.manifest, staged.layout,
                                       staged.bytes, options);
    INFO(live.status().ToString());
    REQUIRE(live.ok());

    FlipFirstByte(&staged);
    auto refused = GoLiveFromStagedTensor(config, staged.manifest,
                                          staged.layout, staged.bytes, options);
    REQUIRE_FALSE(refused.ok());
    CHECK(IsDigestMismatch(refused.status()));
    CHECK_THAT(std::string(refused.status().message()),
               Catch::Contains("weights v3 refused: tree sha256 mismatch"));
  }
}

TEST_CASE("kTree checks the tree root, not the plain SHA-256",
          "[weights][device][tree_digest]") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  Staged staged = StageVersion(config, 4);
  // A wrong plain digest does not matter when the tree is checked...
  DeviceGoLiveOptions options = TreeOptions(staged.manifest);
  options.expected_sha256 = std::string(kWeightSha256Bytes, 'x');
  CHECK(
      VerifyStagedTensor(staged.manifest, staged.layout, staged.bytes, options)
          .ok());
  // ...and refuses the version when it is (kAuto on a CPU tensor with
  // both digests: the plain one).
  options.digest = GoLiveDigest::kAuto;
  CHECK(IsDigestMismatch(VerifyStagedTensor(staged.manifest, staged.layout,
                                            staged.bytes, options)));
  // kAuto with only a tree root checks the tree.
  options.expected_sha256.clear();
  options.expected_tree_sha256 = std::string(kWeightSha256Bytes, 'y');
  CHECK(IsDigestMismatch(VerifyStagedTensor(staged.manifest, staged.layout,
                                            staged.bytes, options)));
  // kSha256 never looks at the tree.
  options.digest = GoLiveDigest::kSha256;
  CHECK(
      VerifyStagedTensor(staged.manifest, staged.layout, staged.bytes, options)
          .ok());
}

TEST_CASE("kTree runs the caller's tree function and needs a tree root",
          "[weights][device][tree_digest]") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  Staged staged = StageVersion(config, 5);
  DeviceGoLiveOptions options = TreeOptions(staged.manifest);
  int calls = 0;
  uint64_t hashed = 0;
  options.tree_sha256 = [&](const uint8_t* d,
                            uint64_t n) -> absl::StatusOr<std::string> {
    ++calls;
    hashed = n;
    return WeightTreeSha256({d, n});
  };
  CHECK(
      VerifyStagedTensor(staged.manifest, staged.layout, staged.bytes, options)
          .ok());
  CHECK(calls == 1);
  CHECK(hashed == staged.layout.total_bytes());
  // A device function that fails: its error, nothing goes live.
  options.tree_sha256 = [](const uint8_t*,
                           uint64_t) -> absl::StatusOr<std::string> {
    return absl::InternalError("Sha256TreeDevice: leaf kernel launch: boom");
  };
  CHECK(absl::IsInternal(VerifyStagedTensor(staged.manifest, staged.layout,
                                            staged.bytes, options)));
  options.tree_sha256 = nullptr;
  options.expected_tree_sha256.clear();
  const absl::Status none =
      VerifyStagedTensor(staged.manifest, staged.layout, staged.bytes, options);
  CHECK(absl::IsFailedPrecondition(none));
  CHECK_THAT(std::string(none.message()),
             Catch::Contains("weights v5: the tree digest is required"));
}

}  // namespace
}  // namespace tandem::weights
