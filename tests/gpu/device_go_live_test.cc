// GPU cases of going live from device memory (common/weights/
// device_go_live.h; issue 22 item 4), part of gpu_cuda_ipc_test (its
// main() skips without a CUDA device): a version flattened into device
// memory, as CUDA IPC's device copy or a device broadcast leaves it, is
// verified on the device (CRC-32C by kernels/cuda, isfinite, SHA-256 via
// pinned pieces) and the live weights are CUDA tensors viewing that very
// buffer: no host copy of the weights.

#include "common/weights/device_go_live.h"

#include <torch/torch.h>

#include <cstring>
#include <limits>

#include "common/model/model_weights.h"
#include "common/weights/device_flattening.h"
#include "common/weights/model_flattening.h"
#include "common/weights/weight_digest.h"
#include "kernels/cuda/crc32c_cuda.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

DeviceGoLiveOptions DeviceOptions(const v1::WeightManifest& manifest) {
  DeviceGoLiveOptions options;
  options.expected_sha256 = manifest.sha256();
  options.crc32c = [](const uint8_t* d,
                      uint64_t n) -> absl::StatusOr<uint32_t> {
    return kernels::cuda::Crc32cDevice(d, n);
  };
  return options;
}

TEST_CASE(
    "device go-live: a version in device memory is verified there and the "
    "live weights are CUDA views of it, bit-exact",
    "[gpu][cuda_ipc][go_live]") {
  for (const auto dtype :
       {model::WeightDType::kFloat32, model::WeightDType::kBFloat16}) {
    model::ModelConfig config = model::testing::TinyQwen2Config();
    config.dtype = dtype;
    auto cpu = model::RandomInit(config, 11, {});
    REQUIRE(cpu.ok());
    auto on_gpu = (*cpu)->To(at::Device(at::kCUDA, 0), dtype);
    REQUIRE(on_gpu.ok());
    LayoutOptions layout_options;
    layout_options.bucket_bytes = 64 << 10;
    auto layout = LayoutForModel(**on_gpu, layout_options);
    REQUIRE(layout.ok());
    auto host = FlattenModel(**on_gpu, *layout);  // for the manifest only
    REQUIRE(host.ok());
    auto manifest = layout->BuildManifest(**host, 4);
    REQUIRE(manifest.ok());
    manifest->set_sha256(WeightSha256(**host).value());
    at::Tensor staged =
        at::empty({static_cast<int64_t>(layout->total_bytes())},
                  at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
    REQUIRE(FlattenModelInto(**on_gpu, *layout, staged).ok());
    torch::cuda::synchronize();

    auto live = GoLiveFromStagedTensor(config, *manifest, *layout, staged,
                                       DeviceOptions(*manifest));
    INFO(live.status().ToString());
    REQUIRE(live.ok());
    const auto* base = static_cast<const uint8_t*>(staged.data_ptr());
    for (const TensorPlacement& p : layout->tensors()) {
      INFO(p.info.name);
      const at::Tensor& t = (*live)->tensors().at(p.info.name);
      CHECK(t.is_cuda());
      // No host copy: the live tensor IS the staged device bytes.
      CHECK(static_cast<const void*>(t.data_ptr()) ==
            static_cast<const void*>(base + p.offset));
      CHECK(at::equal(t, (*on_gpu)->tensors().at(p.info.name)));
    }

    // The host bit scan cannot read device memory: asked for, it is a
    // clear refusal, not a crash.
    DeviceGoLiveOptions bit_scan = DeviceOptions(*manifest);
    bit_scan.finite_check = FiniteCheck::kBitScan;
    CHECK(absl::IsFailedPrecondition(
        VerifyStagedTensor(*manifest, *layout, staged, bit_scan)));

    // A flipped byte on the device: the device CRC refuses it.
    at::Tensor corrupt = staged.clone();
    corrupt.narrow(0, 100, 1).bitwise_xor_(0x10);
    auto refused = GoLiveFromStagedTensor(config, *manifest, *layout, corrupt,
                                          DeviceOptions(*manifest));
    CHECK(absl::IsDataLoss(refused.status()));
    CHECK_THAT(std::string(refused.status().message()),
               Catch::Contains("bucket 0: CRC-32C"));

    // A NaN whose CRCs match (a trainer that sent it): the device finite
    // check refuses it, naming the tensor.
    at::Tensor nan = staged.clone();
    const TensorPlacement* norm = layout->Find("model.norm.weight");
    REQUIRE(norm != nullptr);
    nan.narrow(0, static_cast<int64_t>(norm->offset),
               static_cast<int64_t>(norm->info.byte_size))
        .view(dtype == model::WeightDType::kBFloat16 ? at::kBFloat16
                                                     : at::kFloat)
        .fill_(std::numeric_limits<float>::quiet_NaN());
    v1::WeightManifest resealed = *manifest;
    const auto* nan_base = static_cast<const uint8_t*>(nan.data_ptr());
    for (v1::BucketSpec& b : *resealed.mutable_buckets()) {
      auto crc = kernels::cuda::Crc32cDevice(nan_base + b.byte_offset(),
                                             b.byte_size());
      REQUIRE(crc.ok());
      b.set_crc32c(*crc);
    }
    DeviceGoLiveOptions no_digest = DeviceOptions(resealed);
    no_digest.expected_sha256.clear();
    auto nonfinite =
        GoLiveFromStagedTensor(config, resealed, *layout, nan, no_digest);
    CHECK(IsNonFiniteWeights(nonfinite.status()));
    // The host staging path's refusal, element and all (finite_weights.h).
    CHECK_THAT(std::string(nonfinite.status().message()),
               Catch::Contains("tensor 'model.norm.weight' (") &&
                   Catch::Contains("holds a non-finite value: element 0 is "
                                   "NaN"));
  }
}

}  // namespace
}  // namespace tandem::weights
