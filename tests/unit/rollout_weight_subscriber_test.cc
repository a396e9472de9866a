// A rollout worker's WeightSubscriber follows a trainer's WeightServer: each
// published version is pulled in the background, staged, and committed by
// the engine at a step boundary; the decoder then holds exactly the
// published weights and tokens carry the new version. The coordinator
// (here a function answering SyncWeightGroup) names the trainer; while it
// is down the subscriber pulls from the trainer it last named.

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "services/rollout/weight_subscriber.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

void Publish(weights::WeightStore* store, const model::ModelWeights& w,
             uint64_t version) {
  auto layout = weights::LayoutForModel(w);
  REQUIRE(layout.ok());
  auto flat = weights::FlattenModel(w, *layout);
  REQUIRE(flat.ok());
  auto manifest = layout->BuildManifest(**flat, version);
  REQUIRE(manifest.ok());
  manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  manifest->set_anchor_version(version);
  REQUIRE(store->Put(*manifest, *flat).ok());
}

TEST_CASE(
    "the subscriber pulls each published version and the engine commits it") {
  const model::ModelConfig config = model::testing::TinyQwen2Config();
  auto initial = model::RandomInit(config, 1);
  REQUIRE(initial.ok());
  auto decoder = std::make_shared<model::DecoderModel>(*initial);
  StagedWeightSource source(decoder);
  engine::TorchEngineModel engine_model(decoder, 256);
  engine::Engine engine({}, &engine_model, &source, 0);

  weights::WeightStore store(4);
  weights::WeightServerService service(&store, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  // The coordinator's side of SyncWeightGroup: no trainer before the first
  // publish, then the trainer's address. It stops answering after version
  // 1; the subscriber keeps pulling from the trainer it was told.
  std::atomic<bool> published_any{false};
  std::atomic<bool> coordinator_up{true};
  std::atomic<bool> asked_broadcast{false};
  std::atomic<int> asked{0};
  const std::string address = absl::StrCat("127.0.0.1:", port);
  WeightSyncOptions options;
  options.member_id = [] { return std::string("worker-1"); };
  options.sync_weight_group = [&](const v1::SyncWeightGroupRequest& request,
                                  v1::SyncWeightGroupResponse* response) {
    ++asked;
    if (request.broadcast()) asked_broadcast = true;
    if (!coordinator_up) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator down");
    }
    if (published_any) response->set_weight_server_address(address);
    return grpc::Status::OK;
  };
  auto subscriber = WeightSubscriber::Create(decoder, &source, 0, options);
  REQUIRE(subscriber.ok());
  (*subscriber)->Start();

  for (uint64_t version = 1; version <= 2; ++version) {
    auto published = model::RandomInit(config, 10 + version);
    REQUIRE(published.ok());
    Publish(&store, **published, version);
    published_any = true;
    coordinator_up = version == 1;
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (source.ReadyVersion(engine.policy_version()) != version &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    REQUIRE(source.ReadyVersion(engine.policy_version()) == version);
    engine::SamplingParams params;
    params.max_tokens = 2;
    REQUIRE(engine.Add("r" + std::to_string(version), {2, 3, 4}, params).ok());
    while (!engine.idle()) REQUIRE(engine.Step().ok());
    CHECK(engine.policy_version() == version);
    for (const auto& f : engine.TakeFinished()) {
      REQUIRE(f.spans.size() == 1);
      CHECK(f.spans[0].policy_version == version);
      CHECK(f.spans[0].num_tokens == 2);
    }
    for (const auto& [name, tensor] : (*published)->tensors()) {
      INFO(name);
      CHECK(at::equal(tensor, decoder->weights()->tensors().at(name)));
    }
  }
  CHECK((*subscriber)->versions_received() == 2);
  CHECK(asked > 0);
  CHECK_FALSE(asked_broadcast);  // pull mode never offers to join a group
  (*subscriber)->Stop();
  server->Shutdown();
}

}  // namespace
}  // namespace tandem::rollout
