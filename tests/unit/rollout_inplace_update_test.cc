// The rollout worker's `update_mode: inplace` (StagedWeightSource::Mode::
// kInplace): at the step boundary the staged version's values are copied
// into the live tensors (same storage, no pointer swap); afterwards the live
// weights equal the new version bit for bit, the engine's version is bumped
// and generation continues under the new weights (with kv_policy recompute
// every later log-prob equals the new weights' full forward).

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "services/rollout/engine/engine.h"
#include "services/rollout/torch_engine_model.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

std::shared_ptr<model::ModelWeights> Weights(uint64_t seed,
                                             model::WeightDType dtype) {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.dtype = dtype;
  // Larger than the default init, so that two versions' log-probs differ
  // clearly (model_test's kTestInit).
  auto w = model::RandomInit(config, seed, {.stddev = 0.15, .norm_noise = 0.2});
  REQUIRE(w.ok());
  return *w;
}

// Log-probs of `output` after `prompt` under `weights` (one packed forward).
std::vector<float> FullForwardLogProbs(
    std::shared_ptr<model::ModelWeights> weights,
    const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), output.begin(), output.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  model::DecoderModel model(std::move(weights));
  auto logits = model.ForwardPacked(
      torch::tensor(ids, torch::kLong), torch::arange(n, torch::kLong),
      torch::tensor(std::vector<int64_t>{0, n}, torch::kLong));
  REQUIRE(logits.ok());
  const auto logprobs = torch::log_softmax(logits->to(torch::kFloat), -1);
  std::vector<float> out;
  for (size_t t = 0; t < output.size(); ++t) {
    const int64_t row = static_cast<int64_t>(prompt.size() + t) - 1;
    out.push_back(logprobs[row][output[t]].item<float>());
  }
  return out;
}

TEST_CASE("inplace update: live weights become the new version bit for bit, "
          "the version bumps and generation follows the new weights") {
  const model::WeightDType dtype = GENERATE(model::WeightDType::kFloat32,
                                            model::WeightDType::kBFloat16);
  INFO("dtype " << model::WeightDTypeName(dtype));
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1, dtype));
  const model::ModelWeights* live = decoder->weights().get();
  std::map<std::string, const void*> storage;
  for (const auto& [name, tensor] : live->tensors()) {
    storage[name] = tensor.data_ptr();
  }
  TorchEngineModel engine_model(decoder, 256);
  StagedWeightSource source(decoder, StagedWeightSource::Mode::kInplace);
  EngineOptions options;
  options.limits.max_num_seqs = 4;
  options.limits.max_batched_tokens = 64;
  options.num_kv_blocks = 256;
  options.block_size = 16;
  options.kv_policy = EngineOptions::KvPolicy::kRecompute;
  Engine engine(options, &engine_model, &source, 0);
  SamplingParams params;
  params.seed = 5;
  params.max_tokens = 10;
  const std::vector<int32_t> prompt = {9, 14, 27, 3, 60, 41};
  REQUIRE(engine.Add("a", prompt, params).ok());
  for (int i = 0; i < 4; ++i) REQUIRE(engine.Step().ok());
  CHECK(engine.policy_version() == 0);

  const auto next = Weights(2, dtype);
  source.Stage(1, next);
  CHECK(source.ReadyVersion(0) == 1);
  bool committed = false;
  std::map<std::string, FinishedSample> done;
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    auto step = engine.Step();
    REQUIRE(step.ok());
    if (step->committed_update) {
      CHECK(step->committed_version == 1);
      committed = true;
    }
    for (auto& f : engine.TakeFinished()) done[f.request_id] = f;
  }
  REQUIRE(committed);
  CHECK(engine.policy_version() == 1);
  CHECK(engine.Snapshot().policy_version == 1);
  CHECK(source.ReadyVersion(1) == 0);

  // Same ModelWeights object and storage, values of the new version.
  REQUIRE(decoder->weights().get() == live);
  for (const auto& [name, tensor] : live->tensors()) {
    INFO(name);
    CHECK(tensor.data_ptr() == storage.at(name));
    CHECK(tensor.dtype() == next->tensors().at(name).dtype());
    CHECK(torch::equal(tensor, next->tensors().at(name)));
  }

  // Tokens 0-3 came from version 0, the rest from version 1, and each
  // log-prob is its version's.
  const FinishedSample& s = done.at("a");
  REQUIRE(s.output.size() == 10);
  REQUIRE(s.spans.size() == 2);
  CHECK(s.spans[0].policy_version == 0);
  CHECK(s.spans[0].num_tokens == 4);
  CHECK(s.spans[1].policy_version == 1);
  CHECK(s.spans[1].num_tokens == 6);
  const auto old_lp = FullForwardLogProbs(Weights(1, dtype), prompt, s.output);
  const auto new_lp = FullForwardLogProbs(next, prompt, s.output);
  // The cached decode and the full forward round bf16 intermediates
  // differently (model_test: "cached decode equals the full forward in bf16
  // within 0.25").
  const double margin = dtype == model::WeightDType::kFloat32 ? 1e-4 : 0.25;
  double to_new = 0, to_old = 0;
  for (size_t t = 0; t < s.output.size(); ++t) {
    INFO("token " << t);
    const float expected = t < 4 ? old_lp[t] : new_lp[t];
    CHECK(s.logprobs[t] == Approx(expected).margin(margin));
    if (t >= 4) {
      to_new += std::abs(s.logprobs[t] - new_lp[t]);
      to_old += std::abs(s.logprobs[t] - old_lp[t]);
    }
  }
  INFO("after the update: |lp - new| " << to_new << ", |lp - old| " << to_old);
  CHECK(to_new < 0.25 * to_old);

  // A request that starts after the update generates under the new weights.
  REQUIRE(engine.Add("b", prompt, params).ok());
  std::map<std::string, FinishedSample> after;
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    REQUIRE(engine.Step().ok());
    for (auto& f : engine.TakeFinished()) after[f.request_id] = f;
  }
  const FinishedSample& b = after.at("b");
  REQUIRE(b.spans.size() == 1);
  CHECK(b.spans[0].policy_version == 1);
  const auto b_lp = FullForwardLogProbs(next, prompt, b.output);
  for (size_t t = 0; t < b.output.size(); ++t) {
    INFO("token " << t);
    CHECK(b.logprobs[t] == Approx(b_lp[t]).margin(margin));
  }
}

}  // namespace
}  // namespace tandem::rollout
