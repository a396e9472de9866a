// Going live from a staged tensor (common/weights/device_go_live.h), run on
// the CPU: the "device" staging buffer is a CPU uint8 tensor, and the
// per-bucket CRC goes through the same BucketCrc32c seam a CUDA worker
// fills with the device kernel. The GPU cases are in tests/gpu.

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/model_weights.h"
#include "common/weights/device_go_live.h"
#include "common/weights/model_flattening.h"
#include "common/weights/staging_weights.h"
#include "common/weights/weight_digest.h"
#include "common/weights/weight_transport.h"
#include "kernels/crc32c.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

struct Version {
  std::shared_ptr<model::ModelWeights> weights;
  v1::WeightManifest manifest;
  at::Tensor staged;  // the flat bytes, as a device buffer would hold them
};

// Version `v` of a tiny model in `dtype`, in several buckets, signed.
Version MakeVersion(const model::ModelConfig& config, uint64_t v) {
  auto weights = model::RandomInit(config, static_cast<int>(100 + v));
  REQUIRE(weights.ok());
  LayoutOptions options;
  options.bucket_bytes = 64 << 10;
  auto layout = LayoutForModel(**weights, options);
  REQUIRE(layout.ok());
  auto flat = FlattenModel(**weights, *layout);
  REQUIRE(flat.ok());
  auto manifest = layout->BuildManifest(**flat, v);
  REQUIRE(manifest.ok());
  auto sha = WeightSha256(**flat);
  REQUIRE(sha.ok());
  manifest->set_sha256(*sha);
  at::Tensor staged = at::empty({static_cast<int64_t>((*flat)->size())},
                                at::TensorOptions(at::kByte));
  std::memcpy(staged.data_ptr(), (*flat)->data(), (*flat)->size());
  return {*std::move(weights), *std::move(manifest), staged};
}

FlatWeightLayout WorkerLayout(const model::ModelConfig& config) {
  LayoutOptions options;
  options.bucket_bytes = 64 << 10;
  auto layout = LayoutForConfig(config, options);
  REQUIRE(layout.ok());
  return *std::move(layout);
}

// The BucketCrc32c a CUDA worker passes, here over host memory; counts the
// buckets it checked.
DeviceGoLiveOptions Options(const v1::WeightManifest& manifest, int* crcs) {
  DeviceGoLiveOptions options;
  options.expected_sha256 = manifest.sha256();
  options.piece_bytes = 4096;  // many pieces, as on a large model
  options.crc32c = [crcs](const uint8_t* d,
                          uint64_t n) -> absl::StatusOr<uint32_t> {
    ++*crcs;
    return kernels::Crc32c(d, n);
  };
  return options;
}

// Sets bucket CRCs (not the digest) from the staged bytes, as a trainer
// would for bytes it believes good.
void ResealCrcs(v1::WeightManifest* manifest, const at::Tensor& staged) {
  const auto* base = static_cast<const uint8_t*>(staged.data_ptr());
  for (v1::BucketSpec& b : *manifest->mutable_buckets()) {
    b.set_crc32c(kernels::Crc32c(base + b.byte_offset(), b.byte_size()));
  }
}

TEST_CASE("N versions go live bit for bit as views of the staged buffer",
          "[weights][device]") {
  for (model::WeightDType dtype :
       {model::WeightDType::kFloat32, model::WeightDType::kBFloat16}) {
    model::ModelConfig config = model::testing::TinyQwen2Config();
    config.dtype = dtype;
    const FlatWeightLayout layout = WorkerLayout(config);
    REQUIRE(layout.num_buckets() > 1);
    std::shared_ptr<model::ModelWeights> live;
    for (uint64_t v = 1; v <= 4; ++v) {
      Version version = MakeVersion(config, v);
      int crcs = 0;
      DeviceGoLiveOptions options = Options(version.manifest, &crcs);
      // Both checks pass.
      options.finite_check = v % 2 == 0 ? FiniteCheck::kTorch
                                        : FiniteCheck::kBitScan;
      auto got = GoLiveFromStagedTensor(config, version.manifest, layout,
                                        version.staged, options);
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      CHECK(crcs == version.manifest.buckets_size());
      live = *std::move(got);  // the swap
      const auto* base = static_cast<const uint8_t*>(version.staged.data_ptr());
      for (const TensorPlacement& p : layout.tensors()) {
        INFO(p.info.name);
        const at::Tensor& t = live->tensors().at(p.info.name);
        // A view into the staging buffer: no copy of the weights.
        CHECK(static_cast<const void*>(t.data_ptr()) ==
              static_cast<const void*>(base + p.offset));
        CHECK(at::equal(t, version.weights->tensors().at(p.info.name)));
      }
      // The views keep the buffer: the caller may drop its handle.
      const void* storage = version.staged.storage().data();
      version.staged.reset();
      CHECK(live->embed_tokens().storage().data() == storage);
    }
  }
}

TEST_CASE("a corrupted byte is refused by the bucket CRC, nothing goes live",
          "[weights][device]") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  const FlatWeightLayout layout = WorkerLayout(config);
  Version version = MakeVersion(config, 7);
  const v1::BucketSpec& last =
      version.manifest.buckets(version.manifest.buckets_size() - 1);
  auto* byte =
      static_cast<uint8_t*>(version.staged.data_ptr()) + last.byte_offset() + 5;
  *byte ^= 0x40;
  int crcs = 0;
  auto got =
      GoLiveFromStagedTensor(config, version.manifest, layout, version.staged,
                             Options(version.manifest, &crcs));
  REQUIRE_FALSE(got.ok());
  CHECK(absl::IsDataLoss(got.status()));
  CHECK_THAT(
      std::string(got.status().message()),
      Catch::Contains("weights v7 bucket " +
                      std::to_string(version.manifest.buckets_size() - 1) +
                      ": CRC-32C"));
}

TEST_CASE("a non-finite value is refused naming the tensor",
          "[weights][device]") {
  for (const FiniteCheck check : {FiniteCheck::kAuto, FiniteCheck::kBitScan,
                                  FiniteCheck::kTorch})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
      INFO("finite check: " << static_cast<int>(check));
      model::ModelConfig config = model::testing::TinyQwen2Config();
      const FlatWeightLayout layout = WorkerLayout(config);
      Version version = MakeVersion(config, 3);
      const TensorPlacement* p = layout.Find("model.norm.weight");
      REQUIRE(p != nullptr);
      std::memcpy(
          static_cast<uint8_t*>(version.staged.data_ptr()) + p->offset + 4,
          &bad, sizeof(bad));
      // CRCs and digest of the bad bytes: only the finite check can refuse.
      ResealCrcs(&version.manifest, version.staged);
      const auto* base = static_cast<const uint8_t*>(version.staged.data_ptr());
      auto sha = WeightSha256({base, layout.total_bytes()});
      REQUIRE(sha.ok());
      version.manifest.set_sha256(*sha);
      int crcs = 0;
      DeviceGoLiveOptions options = Options(version.manifest, &crcs);
      options.finite_check = check;
      auto got = GoLiveFromStagedTensor(config, version.manifest, layout,
                                        version.staged, options);
      REQUIRE_FALSE(got.ok());
      CHECK(absl::IsDataLoss(got.status()));
      CHECK(IsNonFiniteWeights(got.status()));
      CHECK_THAT(std::string(got.status().message()),
                 Catch::Contains("weights v3 refused: tensor "
                                 "'model.norm.weight' (F32) holds a non-finite "
                                 "value: element 1 is " +
                                 std::string(std::isnan(bad) ? "NaN" : "+Inf")));
    }
}

TEST_CASE(
    "the host staging path and both device finite checks refuse a non-finite "
    "F16 value with the same code and message",
    "[weights][device][finite]") {
  // An F16 tensor between an F32 and a BF16 one, spanning buckets: the
  // model configs have no F16 dtype, so this is VerifyStagedTensor on a
  // layout of its own against StagingWeights on the same layout.
  auto layout = FlatWeightLayout::Create(
      {{"a", v1::DTYPE_F32, {300}, 1200},
       {"h", v1::DTYPE_F16, {3000}, 6000},
       {"b", v1::DTYPE_BF16, {100}, 200}},
      {.bucket_bytes = 4096, .alignment = 64});
  REQUIRE(layout.ok());
  const TensorPlacement* h = layout->Find("h");
  REQUIRE(h != nullptr);
  struct Case {
    uint16_t bits;
    const char* name;
  };
  for (const Case c : {Case{0x7E00, "NaN"}, Case{0xFC00, "-Inf"}}) {
    INFO(c.name);
    // Zero bytes are finite in every format: only element 2500 of 'h' is
    // not.
    at::Tensor staged = at::zeros({static_cast<int64_t>(layout->total_bytes())},
                                  at::TensorOptions(at::kByte));
    auto* base = static_cast<uint8_t*>(staged.data_ptr());
    std::memcpy(base + h->offset + 2 * 2500, &c.bits, sizeof(c.bits));
    const absl::Span<const uint8_t> flat(base, layout->total_bytes());
    auto manifest = layout->BuildManifest(flat, 9);
    REQUIRE(manifest.ok());

    auto staging = StagingWeights::Create(*layout, StagingMode::kDoubleBuffer);
    REQUIRE(staging.ok());
    const absl::Status host = StagePayload(staging->get(), *manifest, flat);
    DeviceGoLiveOptions options;
    options.expected_sha256 = manifest->sha256();
    options.finite_check = FiniteCheck::kBitScan;
    const absl::Status bit_scan =
        VerifyStagedTensor(*manifest, *layout, staged, options);
    options.finite_check = FiniteCheck::kTorch;
    const absl::Status torch =
        VerifyStagedTensor(*manifest, *layout, staged, options);

    const std::string expected = absl::StrCat(
        "weights v9 refused: tensor 'h' (F16) holds a non-finite value: "
        "element 2500 is ",
        c.name, " (bucket ", (h->offset + 2 * 2500) / 4096, ")");
    for (const absl::Status& s : {host, bit_scan, torch}) {
      INFO(s.ToString());
      CHECK(absl::IsDataLoss(s));
      CHECK(IsNonFiniteWeights(s));
      CHECK(std::string(s.message()) == expected);
    }
    CHECK((*staging)->stats().nonfinite_versions == 1);
  }
}

TEST_CASE("a digest mismatch is refused after the CRCs pass",
          "[weights][device]") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  const FlatWeightLayout layout = WorkerLayout(config);
  Version version = MakeVersion(config, 5);
  // A finite change the CRCs were recomputed for (a forged manifest): the
  // trusted digest is the only line left.
  at::Tensor norm = ViewStagedTensor(config, layout, version.staged)
                        .value()
                        ->tensors()
                        .at("model.norm.weight");
  norm.add_(1.0f);
  ResealCrcs(&version.manifest, version.staged);
  int crcs = 0;
  auto got =
      GoLiveFromStagedTensor(config, version.manifest, layout, version.staged,
                             Options(version.manifest, &crcs));
  REQUIRE_FALSE(got.ok());
  CHECK(IsDigestMismatch(got.status()));
  CHECK(crcs == version.manifest.buckets_size());
}

TEST_CASE("bad buffers and missing CRC functions are clear errors",
          "[weights][device]") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  const FlatWeightLayout layout = WorkerLayout(config);
  Version version = MakeVersion(config, 2);
  int crcs = 0;
  DeviceGoLiveOptions options = Options(version.manifest, &crcs);
  auto shorter = version.staged.narrow(0, 0, version.staged.numel() - 64);
  absl::Status s =
      VerifyStagedTensor(version.manifest, layout, shorter, options);
  CHECK(absl::IsInvalidArgument(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("weights v2"));
  s = VerifyStagedTensor(version.manifest, layout,
                         version.staged.to(at::kFloat), options);
  CHECK(absl::IsInvalidArgument(s));
  // A host CRC over a CPU tensor needs no function.
  options.crc32c = nullptr;
  CHECK(VerifyStagedTensor(version.manifest, layout, version.staged, options)
            .ok());
  // A manifest of another layout is refused before any byte is read.
  v1::WeightManifest other = version.manifest;
  other.mutable_buckets()->RemoveLast();
  CHECK(absl::IsFailedPrecondition(
      VerifyStagedTensor(other, layout, version.staged, options)));
  CHECK(crcs == 0);
}

}  // namespace
}  // namespace tandem::weights
