// GPU test of CUDA IPC weight sync (issue 22 item 4; docs/gpu.md): a
// trainer process serves versions from device memory (DeviceVersionRing,
// cudaIpcGetMemHandle) and this process, as a worker on the same GPU,
// receives each by GrpcPullReceiver with a CudaIpcDeviceSink
// (cudaIpcOpenMemHandle, a device-to-device copy), verifies it (CRC-32C,
// SHA-256) and commits it: every version bit-exact, none streamed. Without
// a visible CUDA device it prints why and exits 77 (ctest: Skipped).
//
// Also: FlattenModelToDevice writes FlattenModel's bytes; and a rollout
// worker's WeightSubscriber makes each version live from the sink's device
// copy (the device go-live: views into that copy, no host round trip).

#define CATCH_CONFIG_RUNNER

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/device.h"
#include "common/model/model_weights.h"
#include "common/weights/cuda_ipc_device.h"
#include "common/weights/device_digest.h"
#include "common/weights/device_flattening.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/staging_weights.h"
#include "services/rollout/weight_subscriber.h"
#include "services/rollout/weight_update_sources.h"
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

// The worker test's model: tiny, bf16 (ipc_pair::FillPayload's bytes are
// finite bf16 values, so the trainer's payloads are valid weights of it).
model::ModelConfig WorkerModelConfig() {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.dtype = model::WeightDType::kBFloat16;
  return config;
}

}  // namespace

// The layout the trainer process serves: size 0 asks for the worker
// test's model.
FlatWeightLayout TrainerLayoutForTest(uint64_t bytes) {
  if (bytes != 0) return ipc_pair::PairLayout(bytes);
  return LayoutForConfig(WorkerModelConfig()).value();
}

namespace {

TEST_CASE(
    "CUDA IPC device go-live: a rollout worker's subscriber makes each "
    "version live as views into the sink's device copy, bit-exact, with no "
    "host round trip, reusing the sink's buffers",
    "[gpu][cuda_ipc]") {
  if (!CudaIpcDeviceSink::Create(0).value()->hands_over()) {
    WARN("SKIPPED: this build has no CUDA kernels (TANDEM_ENABLE_CUDA off)");
    return;
  }
  constexpr uint64_t kVersions = 6;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tandem-cuda-ipc-worker-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    ipc_pair::TrainerProcess trainer(dir, 0, kVersions);
    REQUIRE(trainer.port() > 0);
    const model::ModelConfig config = WorkerModelConfig();
    const FlatWeightLayout layout = TrainerLayoutForTest(0);
    auto initial = model::RandomInit(config, 1, {});
    REQUIRE(initial.ok());
    auto on_gpu =
        (*initial)->To(at::Device(at::kCUDA, 0), model::WeightDType::kBFloat16);
    REQUIRE(on_gpu.ok());
    auto decoder = std::make_shared<model::DecoderModel>(*on_gpu);
    rollout::StagedWeightSource source(decoder);
    auto sink = CudaIpcDeviceSink::Create(0);
    REQUIRE(sink.ok());
    rollout::WeightSyncOptions options;
    options.member_id = [] { return std::string("worker-gpu"); };
    const std::string address = "127.0.0.1:" + std::to_string(trainer.port());
    options.sync_weight_group = [address](const v1::SyncWeightGroupRequest&,
                                          v1::SyncWeightGroupResponse* r) {
      r->set_weight_server_address(address);
      return grpc::Status::OK;
    };
    options.pull_shared_memory = false;
    options.pull_cuda_ipc = sink->get();
    auto subscriber =
        rollout::WeightSubscriber::Create(decoder, &source, 0, options);
    REQUIRE(subscriber.ok());
    (*subscriber)->Start();
    std::vector<uint8_t> expected(layout.total_bytes());
    std::set<const void*> buffers;
    uint64_t live = 0;
    for (uint64_t v = 1; v <= kVersions; ++v) {
      REQUIRE(trainer.PublishedNs(v) > 0);
      const absl::Time give_up = absl::Now() + absl::Seconds(60);
      while (source.ReadyVersion(live) != v && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      REQUIRE(source.ReadyVersion(live) == v);
      REQUIRE(source.Commit(v).ok());  // the engine's swap
      live = v;
      // Every live tensor is a view into ONE device allocation of the
      // whole payload (the sink's copy): nothing was copied to the host and
      // back, nor converted.
      const void* storage = nullptr;
      for (const auto& [name, tensor] : decoder->weights()->tensors()) {
        INFO(name);
        REQUIRE(tensor.is_cuda());
        const void* s = tensor.storage().data();
        if (storage == nullptr) storage = s;
        CHECK(s == storage);
        CHECK(tensor.storage().nbytes() == layout.total_bytes());
        const auto* p = static_cast<const uint8_t*>(tensor.data_ptr());
        CHECK(p >= static_cast<const uint8_t*>(storage));
        CHECK(p + tensor.nbytes() <=
              static_cast<const uint8_t*>(storage) + layout.total_bytes());
      }
      buffers.insert(storage);
      // Bit-exact: the live weights flattened are the trainer's payload.
      auto flat = FlattenModel(*decoder->weights(), layout);
      REQUIRE(flat.ok());
      ipc_pair::FillPayload(v, absl::MakeSpan(expected));
      CHECK(**flat == expected);
      trainer.Ack(v);
    }
    (*subscriber)->Stop();
    // The sink's pool: buffers of swapped-out versions are reused, so six
    // versions need far fewer than six allocations.
    CHECK((*sink)->allocations() <= 3);
    CHECK(buffers.size() <= 3);
    CHECK((*subscriber)->versions_received() == kVersions);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) {
  if (argc > 1 &&
      std::string(argv[1]) == tandem::weights::ipc_pair::kTrainerFlag) {
    return tandem::weights::ipc_pair::RunIpcTrainer(
        argc, argv, tandem::weights::TrainerLayoutForTest);
  }
  if (tandem::model::CudaDeviceCount() == 0) {
    const absl::Status why = tandem::model::CheckDeviceUsable("device", "cuda");
    std::printf("SKIPPED: %s\n", std::string(why.message()).c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
