// A model's weights go through the whole catch-up path — flatten, publish
// with a manifest into the WeightStore, serve over a real gRPC WeightServer,
// pull into StagingWeights, verify, commit, rebuild ModelWeights — and come
// out bit for bit equal, in float32 and bfloat16.

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/device_flattening.h"
#include "common/weights/model_flattening.h"
#include "common/weights/staging_weights.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

void RoundTrip(model::WeightDType dtype) {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.dtype = dtype;
  auto trained = model::RandomInit(config, 21);  // the trainer's new version
  auto initial = model::RandomInit(config, 22);  // what the worker runs
  REQUIRE(trained.ok());
  REQUIRE(initial.ok());
  LayoutOptions options;
  options.bucket_bytes = 64 << 10;  // several buckets
  auto layout = LayoutForModel(**trained, options);
  REQUIRE(layout.ok());
  REQUIRE(layout->num_buckets() > 1);
  auto flat = FlattenModel(**trained, *layout);
  REQUIRE(flat.ok());
  auto manifest = layout->BuildManifest(**flat, 1);
  REQUIRE(manifest.ok());
  manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  manifest->set_anchor_version(1);

  WeightStore store(4);
  REQUIRE(store.Put(*manifest, *flat).ok());
  WeightServerService service(&store, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  REQUIRE(server != nullptr);

  // The worker derives the same layout from its own (older) weights.
  auto worker_layout = LayoutForModel(**initial, options);
  REQUIRE(worker_layout.ok());
  REQUIRE(worker_layout->CheckSameLayout(*manifest).ok());
  auto staging =
      StagingWeights::Create(*worker_layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                          grpc::InsecureChannelCredentials()),
      {});
  auto got =
      receiver.ReceiveNext(staging->get(), absl::Now() + absl::Seconds(20));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == 1);
  REQUIRE((*staging)->Commit().ok());
  const LiveWeights live = (*staging)->live();
  REQUIRE(live.version == 1);
  auto rebuilt = UnflattenModel(config, *worker_layout, live.bytes);
  INFO(rebuilt.status().ToString());
  REQUIRE(rebuilt.ok());
  for (const auto& [name, tensor] : (*trained)->tensors()) {
    INFO(name);
    CHECK(at::equal(tensor, (*rebuilt)->tensors().at(name)));
  }
  server->Shutdown();
}

TEST_CASE("model weights survive publish, pull and rebuild bit for bit") {
  RoundTrip(model::WeightDType::kFloat32);
  RoundTrip(model::WeightDType::kBFloat16);
}

TEST_CASE("viewed weights share the flat buffer and keep it alive") {
  for (model::WeightDType dtype :
       {model::WeightDType::kFloat32, model::WeightDType::kBFloat16}) {
    model::ModelConfig config = model::testing::TinyQwen2Config();
    config.dtype = dtype;
    auto weights = model::RandomInit(config, 3);
    REQUIRE(weights.ok());
    auto layout = LayoutForModel(**weights);
    REQUIRE(layout.ok());
    auto flat = FlattenModel(**weights, *layout);
    REQUIRE(flat.ok());
    auto buffer = std::make_shared<WeightBuffer>(layout->total_bytes());
    std::memcpy(buffer->data(), (*flat)->data(), layout->total_bytes());
    const uint8_t* data = buffer->data();
    auto viewed = ViewFlatModel(config, *layout, buffer);
    INFO(viewed.status().ToString());
    REQUIRE(viewed.ok());
    auto copied = UnflattenModel(config, *layout, buffer->span());
    REQUIRE(copied.ok());
    std::weak_ptr<WeightBuffer> alive = buffer;
    buffer.reset();
    CHECK_FALSE(alive.expired());  // the views hold it
    for (const TensorPlacement& p : layout->tensors()) {
      INFO(p.info.name);
      const at::Tensor& view = (*viewed)->tensors().at(p.info.name);
      CHECK(static_cast<const void*>(view.data_ptr()) ==
            static_cast<const void*>(data + p.offset));
      CHECK(at::equal(view, (*weights)->tensors().at(p.info.name)));
      CHECK(at::equal(view, (*copied)->tensors().at(p.info.name)));
    }
    viewed->reset();
    CHECK(alive.expired());
  }
  model::ModelConfig config = model::testing::TinyQwen2Config();
  auto weights = model::RandomInit(config, 1);
  REQUIRE(weights.ok());
  auto layout = LayoutForModel(**weights);
  REQUIRE(layout.ok());
  CHECK(ViewFlatModel(config, *layout, nullptr).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto short_buffer = std::make_shared<WeightBuffer>(layout->total_bytes() - 1);
  CHECK(ViewFlatModel(config, *layout, short_buffer).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("unflatten refuses a buffer of the wrong size") {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  auto weights = model::RandomInit(config, 1);
  REQUIRE(weights.ok());
  auto layout = LayoutForModel(**weights);
  REQUIRE(layout.ok());
  std::vector<uint8_t> short_buffer(layout->total_bytes() - 1);
  auto rebuilt = UnflattenModel(config, *layout, short_buffer);
  CHECK(rebuilt.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(rebuilt.status().message()),
             Catch::Contains("layout needs"));
}

}  // namespace
}  // namespace tandem::weights

namespace tandem::weights {
namespace {

TEST_CASE(
    "FlattenModelInto (the trainer's device flattening for CUDA IPC) writes "
    "FlattenModel's bytes into a tensor, and refuses a wrong destination") {
  for (const auto dtype :
       {model::WeightDType::kFloat32, model::WeightDType::kBFloat16}) {
    model::ModelConfig config = model::testing::TinyQwen2Config();
    config.dtype = dtype;
    auto weights = model::RandomInit(config, 31);
    REQUIRE(weights.ok());
    auto layout = LayoutForModel(**weights, {.alignment = 256});
    REQUIRE(layout.ok());
    auto flat = FlattenModel(**weights, *layout);
    REQUIRE(flat.ok());
    // Garbage first: the padding must be zeroed too.
    at::Tensor dst = at::full({static_cast<int64_t>(layout->total_bytes())},
                              0x5A, at::TensorOptions().dtype(at::kByte));
    REQUIRE(FlattenModelInto(**weights, *layout, dst).ok());
    CHECK(std::memcmp(dst.data_ptr(), (*flat)->data(), (*flat)->size()) == 0);

    at::Tensor short_dst = at::empty(
        {static_cast<int64_t>(layout->total_bytes()) - 1}, at::kByte);
    const absl::Status refused =
        FlattenModelInto(**weights, *layout, short_dst);
    CHECK(absl::IsInvalidArgument(refused));
    CHECK_THAT(std::string(refused.message()),
               Catch::Contains(std::to_string(layout->total_bytes())));
  }
  // Weights on the CPU are not flattened into CUDA IPC memory.
  auto cpu = model::RandomInit(model::testing::TinyQwen2Config(), 32);
  REQUIRE(cpu.ok());
  auto layout = LayoutForModel(**cpu);
  REQUIRE(layout.ok());
  CHECK(absl::IsFailedPrecondition(
      FlattenModelToDevice(**cpu, *layout, 1).status()));
}

TEST_CASE(
    "CopyDeviceFlatToHost copies a flat buffer's bytes to a new host buffer "
    "(the trainer's host copy of a device-flattened version)",
    "[weights][model][device]") {
  // On the CPU the "device" buffer is host memory: the same copy_ a CUDA
  // trainer runs from device memory (tests/gpu/cuda_ipc_test.cc).
  auto weights = model::RandomInit(model::testing::TinyQwen2Config(), 33);
  REQUIRE(weights.ok());
  auto layout = LayoutForModel(**weights);
  REQUIRE(layout.ok());
  auto flat = FlattenModel(**weights, *layout);
  REQUIRE(flat.ok());
  std::vector<uint8_t> device_bytes = **flat;
  DeviceWeightBuffer buffer;
  buffer.policy_version = 4;
  buffer.payload = device_bytes.data();
  auto host = CopyDeviceFlatToHost(buffer, *layout, c10::Device(c10::kCPU));
  INFO(host.status().ToString());
  REQUIRE(host.ok());
  CHECK((*host)->data() != device_bytes.data());  // a copy, not a view
  CHECK(**host == **flat);

  buffer.payload = nullptr;
  const absl::Status refused =
      CopyDeviceFlatToHost(buffer, *layout, c10::Device(c10::kCPU)).status();
  CHECK(absl::IsInvalidArgument(refused));
  CHECK_THAT(std::string(refused.message()), Catch::Contains("weights v4"));
}

}  // namespace
}  // namespace tandem::weights
