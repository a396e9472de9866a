// GPU cases of the tree digest (kernels/cuda/sha256_tree_cuda.h,
// common/weights/tree_digest.h), part of gpu_cuda_ipc_test (its main()
// skips without a CUDA device): the device root equals the host's
// (OpenSSL) on random buffers at the leaf and fan-in edges, and a version
// staged in device memory goes live on the device tree check alone
// (GoLiveDigest::kAuto), refused when a byte is flipped.

#include <torch/torch.h>

#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/model/model_weights.h"
#include "common/weights/device_flattening.h"
#include "common/weights/device_go_live.h"
#include "common/weights/model_flattening.h"
#include "common/weights/tree_digest.h"
#include "common/weights/weight_digest.h"
#include "kernels/cuda/crc32c_cuda.h"
#include "kernels/cuda/sha256_tree_cuda.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

TEST_CASE("the device tree digest equals the host's (OpenSSL) tree digest",
          "[gpu][tree_digest]") {
  const uint64_t group = kTreeFanout * kTreeLeafBytes;
  const int64_t total = static_cast<int64_t>(kTreeFanout * group + 4099);
  at::Tensor host = at::randint(0, 256, {total}, at::kByte);
  at::Tensor device = host.to(at::Device(at::kCUDA, 0));
  const auto* h = static_cast<const uint8_t*>(host.data_ptr());
  const auto* d = static_cast<const uint8_t*>(device.data_ptr());
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096},
                     uint64_t{4097}, group - 1, group, group + 1,
                     kTreeFanout * group - 1, kTreeFanout * group + 1}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{3}}) {
      INFO(n << " bytes at offset " << offset);
      absl::StatusOr<std::string> on_device =
          kernels::cuda::Sha256TreeDevice(d + offset, n);
      REQUIRE(on_device.ok());
      absl::StatusOr<std::string> on_host = WeightTreeSha256({h + offset, n});
      REQUIRE(on_host.ok());
      CHECK(absl::BytesToHexString(*on_device) ==
            absl::BytesToHexString(*on_host));
    }
  }
}

TEST_CASE(
    "device go-live checks the tree root on the device and refuses a "
    "flipped byte",
    "[gpu][tree_digest][go_live]") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.dtype = model::WeightDType::kBFloat16;
  auto cpu = model::RandomInit(config, 12, {});
  REQUIRE(cpu.ok());
  auto on_gpu = (*cpu)->To(at::Device(at::kCUDA, 0), config.dtype);
  REQUIRE(on_gpu.ok());
  LayoutOptions layout_options;
  layout_options.bucket_bytes = 64 << 10;
  auto layout = LayoutForModel(**on_gpu, layout_options);
  REQUIRE(layout.ok());
  auto host = FlattenModel(**on_gpu, *layout);
  REQUIRE(host.ok());
  auto manifest = layout->BuildManifest(**host, 6);
  REQUIRE(manifest.ok());
  manifest->set_tree_sha256(WeightTreeSha256(**host).value());
  at::Tensor staged =
      at::empty({static_cast<int64_t>(layout->total_bytes())},
                at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
  REQUIRE(FlattenModelInto(**on_gpu, *layout, staged).ok());
  torch::cuda::synchronize();

  DeviceGoLiveOptions options;
  // A wrong plain digest: only the tree check can pass this version.
  options.expected_sha256 = std::string(kWeightSha256Bytes, 'x');
  options.expected_tree_sha256 = manifest->tree_sha256();
  options.crc32c = [](const uint8_t* d,
                      uint64_t n) -> absl::StatusOr<uint32_t> {
    return kernels::cuda::Crc32cDevice(d, n);
  };
  options.tree_sha256 = [](const uint8_t* d,
                           uint64_t n) -> absl::StatusOr<std::string> {
    return kernels::cuda::Sha256TreeDevice(d, n);
  };
  auto live =
      GoLiveFromStagedTensor(config, *manifest, *layout, staged, options);
  INFO(live.status().ToString());
  REQUIRE(live.ok());

  // The lowest mantissa bit of the first weight, CRCs resealed: only the
  // digest can refuse it.
  at::Tensor corrupt = staged.clone();
  corrupt.narrow(0, 0, 1).bitwise_xor_(0x01);
  v1::WeightManifest resealed = *manifest;
  const auto* base = static_cast<const uint8_t*>(corrupt.data_ptr());
  for (v1::BucketSpec& b : *resealed.mutable_buckets()) {
    auto crc =
        kernels::cuda::Crc32cDevice(base + b.byte_offset(), b.byte_size());
    REQUIRE(crc.ok());
    b.set_crc32c(*crc);
  }
  auto refused =
      GoLiveFromStagedTensor(config, resealed, *layout, corrupt, options);
  CHECK(IsDigestMismatch(refused.status()));
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("tree sha256 mismatch"));
}

}  // namespace
}  // namespace tandem::weights
