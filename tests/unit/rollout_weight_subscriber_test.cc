// A rollout worker's WeightSubscriber follows a trainer's WeightServer: each
// published version is pulled in the background, staged, and committed by
// the engine at a step boundary; the decoder then holds exactly the
// published weights and tokens carry the new version.

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"
#include "common/weights/weight_server.h"
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
  std::atomic<bool> known{false};
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto subscriber = WeightSubscriber::Create(
      decoder, &source, [&] { return known ? address : std::string(); }, 0);
  REQUIRE(subscriber.ok());
  (*subscriber)->Start();

  for (uint64_t version = 1; version <= 2; ++version) {
    auto published = model::RandomInit(config, 10 + version);
    REQUIRE(published.ok());
    Publish(&store, **published, version);
    known = true;
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
  (*subscriber)->Stop();
  server->Shutdown();
}

}  // namespace
}  // namespace tandem::rollout
