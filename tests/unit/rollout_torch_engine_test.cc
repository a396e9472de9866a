// The engine over the real LibTorch decoder (a tiny random Qwen2-shaped
// model): continuous batching does not change greedy tokens, and after an
// inflight swap with kv_policy recompute every log-prob equals the new
// weights' full forward over the same tokens.

#include <torch/torch.h>

#include <map>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "services/rollout/weight_update_sources.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::engine {
namespace {

std::shared_ptr<model::ModelWeights> Weights(uint64_t seed) {
  auto w = model::RandomInit(model::testing::TinyQwen2Config(), seed);
  REQUIRE(w.ok());
  return *w;
}

std::vector<int32_t> Prompt(int r, int len) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(2 + (r * 13 + i * 5) % 90);
  return p;
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

EngineOptions Options(int max_seqs) {
  EngineOptions o;
  o.limits.max_num_seqs = max_seqs;
  o.limits.max_batched_tokens = 64;
  o.num_kv_blocks = 256;
  o.block_size = 16;
  return o;
}

std::map<std::string, FinishedSample> Run(Engine* engine) {
  std::map<std::string, FinishedSample> out;
  for (int i = 0; i < 10000 && !engine->idle(); ++i) {
    auto step = engine->Step();
    REQUIRE(step.ok());
    for (auto& f : engine->TakeFinished()) out[f.request_id] = f;
  }
  return out;
}

TEST_CASE("torch engine: greedy tokens equal alone and in a batch") {
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1));
  std::map<std::string, std::vector<int32_t>> alone;
  for (int r = 0; r < 4; ++r) {
    TorchEngineModel m(decoder, 256);
    Engine e(Options(1), &m, nullptr, 0);
    const std::string id = "r" + std::to_string(r);
    REQUIRE(e.Add(id, Prompt(r, 3 + 2 * r), Greedy(6 + r)).ok());
    alone[id] = Run(&e)[id].output;
  }
  TorchEngineModel m(decoder, 256);
  Engine e(Options(3), &m, nullptr, 0);
  for (int r = 0; r < 4; ++r) {
    REQUIRE(e.Add("r" + std::to_string(r), Prompt(r, 3 + 2 * r), Greedy(6 + r))
                .ok());
    REQUIRE(e.Step().ok());
  }
  auto batched = Run(&e);
  for (auto& [id, tokens] : alone) CHECK(batched[id].output == tokens);
}

TEST_CASE(
    "torch engine: inflight swap with recompute matches the new weights") {
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1));
  TorchEngineModel m(decoder, 256);
  rollout::StagedWeightSource source(decoder);
  EngineOptions options = Options(4);
  options.kv_policy = EngineOptions::KvPolicy::kRecompute;
  Engine e(options, &m, &source, 0);
  SamplingParams params;
  params.seed = 5;
  params.max_tokens = 10;
  const auto prompt = Prompt(7, 6);
  REQUIRE(e.Add("a", prompt, params).ok());
  for (int i = 0; i < 4; ++i) REQUIRE(e.Step().ok());
  auto next = Weights(2);
  source.Stage(1, next);
  auto done = Run(&e);
  const FinishedSample& s = done["a"];
  REQUIRE(s.spans.size() == 2);
  CHECK(s.spans[0].policy_version == 0);
  CHECK(s.spans[0].num_tokens == 4);
  CHECK(s.spans[1].policy_version == 1);
  CHECK(s.spans[1].num_tokens == 6);
  // Full forward of prompt + output under each version's weights.
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), s.output.begin(), s.output.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  auto input = torch::tensor(ids, torch::kLong);
  auto positions = torch::arange(n, torch::kLong);
  auto cu = torch::tensor(std::vector<int64_t>{0, n}, torch::kLong);
  for (uint64_t version : {0, 1}) {
    model::DecoderModel reference(version == 0 ? Weights(1) : next);
    auto logits = reference.ForwardPacked(input, positions, cu);
    REQUIRE(logits.ok());
    auto logprobs = torch::log_softmax(logits->to(torch::kFloat), -1);
    for (size_t t = 0; t < s.output.size(); ++t) {
      if ((t < 4) != (version == 0)) continue;
      const int64_t row = static_cast<int64_t>(prompt.size() + t) - 1;
      const float expected = logprobs[row][s.output[t]].item<float>();
      CHECK(s.logprobs[t] == Approx(expected).margin(1e-4));
    }
  }
}

}  // namespace
}  // namespace tandem::engine
