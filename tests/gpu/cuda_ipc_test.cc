// GPU test of CUDA IPC weight sync (issue 22 item 4; docs/gpu.md): a
// trainer process serves versions from device memory (DeviceVersionRing,
// cudaIpcGetMemHandle) and this process, as a worker on the same GPU,
// receives each by GrpcPullReceiver with a CudaIpcDeviceSink
// (cudaIpcOpenMemHandle, a device-to-device copy), verifies it (CRC-32C,
// SHA-256) and commits it: every version bit-exact, none streamed. Without
// a visible CUDA device it prints why and exits 77 (ctest: Skipped).
//
// Also: FlattenModelToDevice writes FlattenModel's bytes.

#define CATCH_CONFIG_RUNNER

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/model/device.h"
#include "common/model/model_weights.h"
#include "common/weights/cuda_ipc_device.h"
#include "common/weights/device_digest.h"
#include "common/weights/device_flattening.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/staging_weights.h"
#include "tests/gpu/cuda_ipc_pair.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

TEST_CASE(
    "CUDA IPC: versions served from a trainer process's device memory are "
    "received bit-exact by a worker process on the same GPU, none streamed",
    "[gpu][cuda_ipc]") {
  constexpr uint64_t kBytes = uint64_t{96} << 20;
  constexpr uint64_t kVersions = 6;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tandem-cuda-ipc-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    ipc_pair::TrainerProcess trainer(dir, kBytes, kVersions);
    REQUIRE(trainer.port() > 0);
    const FlatWeightLayout layout = ipc_pair::PairLayout(kBytes);
    auto sink = CudaIpcDeviceSink::Create(0);
    REQUIRE(sink.ok());
    auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    REQUIRE(staging.ok());
    GrpcPullReceiver receiver(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(trainer.port()),
                            grpc::InsecureChannelCredentials()),
        {.cuda_ipc = sink->get()});
    std::vector<uint8_t> expected(layout.total_bytes());
    std::shared_ptr<void> held;  // the previous version's device copy
    for (uint64_t v = 1; v <= kVersions; ++v) {
      REQUIRE(trainer.PublishedNs(v) > 0);
      auto got =
          receiver.ReceiveNext(staging->get(), absl::Now() + absl::Seconds(60));
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      REQUIRE(*got == v);
      REQUIRE((*staging)->Commit().ok());
      ipc_pair::FillPayload(v, absl::MakeSpan(expected));
      const auto live = (*staging)->live().bytes;
      REQUIRE(live.size() == expected.size());
      CHECK(std::memcmp(live.data(), expected.data(), live.size()) == 0);
      // The device staging copy too.
      std::vector<uint8_t> device_copy(expected.size());
      REQUIRE((*sink)->ReadStaged(0, absl::MakeSpan(device_copy)).ok());
      CHECK(device_copy == expected);
      // And it meets the manifest's SHA-256 on the device
      // (device_digest.h), as a device-resident go-live would check it.
      const at::Tensor staged = at::from_blob(
          const_cast<void*>((*sink)->staged()),
          {static_cast<int64_t>((*sink)->staged_bytes())},
          at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
      const auto manifest = (*staging)->live_manifest();
      REQUIRE(manifest.has_value());
      REQUIRE_FALSE(manifest->sha256().empty());
      CHECK(VerifyTensorWeightSha256(v, manifest->sha256(), staged).ok());
      // Handing the device copy over (to go live from it, device_go_live.h)
      // keeps it intact: the next version is copied into another buffer.
      std::shared_ptr<void> taken = (*sink)->TakeStaged();
      CHECK(taken.get() == staged.data_ptr());
      CHECK((*sink)->staged() == nullptr);
      if (held != nullptr) {
        CHECK(held.get() != taken.get());
        std::vector<uint8_t> before(expected.size()), want(expected.size());
        REQUIRE(cudaMemcpy(before.data(), held.get(), before.size(),
                           cudaMemcpyDeviceToHost) == cudaSuccess);
        ipc_pair::FillPayload(v - 1, absl::MakeSpan(want));
        CHECK(before == want);  // v - 1 still whole after v arrived
      }
      held = std::move(taken);
      trainer.Ack(v);
    }
    const PullStats stats = receiver.stats();
    CHECK(stats.cuda_ipc_versions == kVersions);
    CHECK(stats.cuda_ipc_bytes == kVersions * layout.total_bytes());
    CHECK(stats.bytes == stats.cuda_ipc_bytes);  // nothing streamed
    CHECK(stats.cuda_ipc_refused + stats.cuda_ipc_open_failures == 0);
    CHECK((*staging)->stats().digest_mismatches == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "CUDA IPC: FlattenModelToDevice writes FlattenModel's bytes, in an "
    "exported buffer",
    "[gpu][cuda_ipc]") {
  auto cpu = model::RandomInit(model::testing::TinyQwen2Config(), 3, {});
  REQUIRE(cpu.ok());
  for (const auto dtype :
       {model::WeightDType::kFloat32, model::WeightDType::kBFloat16}) {
    auto on_gpu = (*cpu)->To(at::Device(at::kCUDA, 0), dtype);
    REQUIRE(on_gpu.ok());
    auto layout = LayoutForModel(**on_gpu);
    REQUIRE(layout.ok());
    auto host = FlattenModel(**on_gpu, *layout);
    REQUIRE(host.ok());
    auto device = FlattenModelToDevice(**on_gpu, *layout, 9);
    INFO(device.status().ToString());
    REQUIRE(device.ok());
    CHECK((*device)->offer.handle().size() == kCudaIpcHandleBytes);
    CHECK((*device)->offer.size() == layout->total_bytes());
    std::vector<uint8_t> back(layout->total_bytes());
    REQUIRE(cudaMemcpy(back.data(), (*device)->payload, back.size(),
                       cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back == **host);
    // The trainer's host copy of the device-flattened version.
    auto copied =
        CopyDeviceFlatToHost(**device, *layout, at::Device(at::kCUDA, 0));
    INFO(copied.status().ToString());
    REQUIRE(copied.ok());
    CHECK(**copied == **host);

    // The next version written into this buffer's memory (the ring lent
    // it): same allocation and handle, a new token, the new bytes.
    auto next = model::RandomInit(model::testing::TinyQwen2Config(), 4, {});
    REQUIRE(next.ok());
    auto next_gpu = (*next)->To(at::Device(at::kCUDA, 0), dtype);
    REQUIRE(next_gpu.ok());
    auto next_host = FlattenModel(**next_gpu, *layout);
    REQUIRE(next_host.ok());
    const void* payload = (*device)->payload;
    const std::string handle = (*device)->offer.handle();
    const std::string token = (*device)->offer.token();
    std::shared_ptr<const DeviceWeightBuffer> lent = *std::move(device);
    auto reused = FlattenModelToDevice(**next_gpu, *layout, 10, nullptr,
                                       std::move(lent));
    INFO(reused.status().ToString());
    REQUIRE(reused.ok());
    CHECK((*reused)->payload == payload);
    CHECK((*reused)->offer.handle() == handle);
    CHECK((*reused)->offer.token() != token);
    CHECK((*reused)->policy_version == 10);
    std::string device_token((*reused)->offer.token().size(), '\0');
    REQUIRE(cudaMemcpy(device_token.data(),
                       static_cast<const uint8_t*>(payload) +
                           layout->total_bytes(),
                       device_token.size(),
                       cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(device_token == (*reused)->offer.token());
    auto reused_bytes =
        CopyDeviceFlatToHost(**reused, *layout, at::Device(at::kCUDA, 0));
    REQUIRE(reused_bytes.ok());
    CHECK(**reused_bytes == **next_host);
  }
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) {
  if (argc > 1 &&
      std::string(argv[1]) == tandem::weights::ipc_pair::kTrainerFlag) {
    return tandem::weights::ipc_pair::RunIpcTrainer(argc, argv);
  }
  if (tandem::model::CudaDeviceCount() == 0) {
    const absl::Status why = tandem::model::CheckDeviceUsable("device", "cuda");
    std::printf("SKIPPED: %s\n", std::string(why.message()).c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
