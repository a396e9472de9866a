// The engine over the real LibTorch decoder (a tiny random Qwen2-shaped
// model): continuous batching does not change greedy tokens, and after an
// inflight swap with kv_policy recompute every log-prob equals the new
// weights' full forward over the same tokens; a multi-turn episode parked
// and resumed with environment tokens (its cache kept, the tokens
// prefilled as one chunk after decoding) continues exactly as one prefill
// of its whole context would.

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

namespace tandem::engine {
namespace {

TEST_CASE(
    "torch engine: a parked episode resumed with environment tokens "
    "continues exactly as one prefill of its whole context") {
  auto decoder = std::make_shared<model::DecoderModel>(Weights(3));
  const std::vector<int32_t> prompt = Prompt(5, 7);
  const std::vector<int32_t> env = {11, 12, 13, 14, 15};
  TorchEngineModel m(decoder, 256);
  Engine e(Options(4), &m, nullptr, 0);
  SamplingParams turns = Greedy(4);
  turns.park_at_turn_end = true;
  REQUIRE(e.Add("episode", prompt, turns).ok());
  REQUIRE(e.Add("other", Prompt(6, 9), Greedy(12)).ok());
  std::vector<ParkedTurn> parked;
  std::map<std::string, FinishedSample> finished;
  auto step_until_parked = [&] {
    parked.clear();
    for (int i = 0; i < 1000 && parked.empty(); ++i) {
      REQUIRE(e.Step().ok());
      for (auto& f : e.TakeFinished()) finished[f.request_id] = f;
      parked = e.TakeParked();
    }
    REQUIRE(parked.size() == 1);
  };
  step_until_parked();
  // The other request keeps decoding while the episode waits.
  for (int i = 0; i < 3; ++i) REQUIRE(e.Step().ok());
  REQUIRE(e.Resume("episode", 0, env, 5).ok());
  step_until_parked();
  REQUIRE(e.EndEpisode("episode", 0).ok());
  for (auto& f : e.TakeFinished()) finished[f.request_id] = f;
  const FinishedSample& episode = finished.at("episode");
  REQUIRE(episode.output.size() == 4 + 5 + 5);
  // (Compared outside CHECK: LibTorch's stream operators for containers
  // shadow Catch's printing of a vector of structs.)
  const bool spans_cover_turns =
      episode.source_spans ==
      std::vector<SourceSpan>{{TokenSource::kModel, 4},
                              {TokenSource::kEnvironment, 5},
                              {TokenSource::kModel, 5}};
  CHECK(spans_cover_turns);

  // Reference: the prompt, turn 1 and the environment's tokens as one
  // prompt, prefilled at once.
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), episode.output.begin(),
                 episode.output.begin() + 9);
  TorchEngineModel ref_model(decoder, 256);
  Engine ref(Options(1), &ref_model, nullptr, 0);
  REQUIRE(ref.Add("ref", context, Greedy(5)).ok());
  const FinishedSample reference = Run(&ref).at("ref");
  CHECK(std::vector<int32_t>(episode.output.begin() + 9,
                             episode.output.end()) == reference.output);
  for (size_t t = 0; t < reference.logprobs.size(); ++t) {
    CHECK(episode.logprobs[9 + t] ==
          Approx(reference.logprobs[t]).margin(1e-4));
  }
  for (size_t t = 4; t < 9; ++t) CHECK(episode.logprobs[t] == 0.0f);
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// One seeded run of groups of samples (forked prompts) through a KV cache
// small enough that the scheduler preempts; returns the samples by
// "request/sample" and whether the caches were paged.
std::map<std::string, FinishedSample> SeededGroups(
    KvLayout layout, bool* paged,
    model::PagedAttention attention = model::PagedAttention::kGather) {
  auto decoder = std::make_shared<model::DecoderModel>(Weights(4));
  EngineOptions options = Options(8);
  options.num_kv_blocks = 24;
  options.block_size = 4;
  TorchEngineModelOptions model_options;
  model_options.kv_layout = layout;
  model_options.kv_blocks = options.num_kv_blocks;
  model_options.block_size = options.block_size;
  model_options.paged_attention = attention;
  TorchEngineModel m(decoder, 256, model_options);
  Engine e(options, &m, nullptr, 0);
  for (int r = 0; r < 6; ++r) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = 100 + r;
    p.max_tokens = 14 + 2 * r;
    p.n = 3;
    REQUIRE(e.Add("r" + std::to_string(r), Prompt(r, 5 + r), p).ok());
  }
  std::map<std::string, FinishedSample> out;
  for (int i = 0; i < 10000 && !e.idle(); ++i) {
    REQUIRE(e.Step().ok());
    for (auto& f : e.TakeFinished()) {
      out[f.request_id + "/" + std::to_string(f.sample_index)] = f;
    }
  }
  *paged = m.paged();
  return out;
}

TEST_CASE(
    "torch engine: paged and contiguous KV layouts give the same seeded "
    "samples through forks and preemptions") {
  bool contiguous_paged = true, paged_paged = false;
  const auto contiguous = SeededGroups(KvLayout::kContiguous, &contiguous_paged);
  const auto paged = SeededGroups(KvLayout::kPaged, &paged_paged);
  CHECK_FALSE(contiguous_paged);
  CHECK(paged_paged);
  REQUIRE(contiguous.size() == 18);
  REQUIRE(paged.size() == 18);
  uint32_t preemptions = 0;
  for (const auto& [id, sample] : contiguous) {
    INFO(id);
    const FinishedSample& other = paged.at(id);
    CHECK(other.output == sample.output);
    REQUIRE(other.logprobs.size() == sample.logprobs.size());
    for (size_t t = 0; t < sample.logprobs.size(); ++t) {
      CHECK(other.logprobs[t] == Approx(sample.logprobs[t]).margin(1e-4));
    }
    preemptions += other.preemptions;
  }
  // The pool was tight enough to exercise preemption (and release).
  CHECK(preemptions > 0);
}

TEST_CASE(
    "torch engine: the paged decode kernel (CPU reference) gives the gather "
    "path's seeded samples") {
  bool paged = false;
  const auto gather =
      SeededGroups(KvLayout::kPaged, &paged, model::PagedAttention::kGather);
  const auto kernel =
      SeededGroups(KvLayout::kPaged, &paged, model::PagedAttention::kKernel);
  CHECK(paged);
  REQUIRE(gather.size() == 18);
  REQUIRE(kernel.size() == 18);
  for (const auto& [id, sample] : gather) {
    INFO(id);
    const FinishedSample& other = kernel.at(id);
    CHECK(other.output == sample.output);
    REQUIRE(other.logprobs.size() == sample.logprobs.size());
    for (size_t t = 0; t < sample.logprobs.size(); ++t) {
      CHECK(other.logprobs[t] == Approx(sample.logprobs[t]).margin(1e-4));
    }
  }
}

TEST_CASE(
    "torch engine: kAuto pages only with a block budget; no CUDA graphs on "
    "the CPU") {
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1));
  for (int64_t blocks : {0, 256}) {
    TorchEngineModelOptions model_options;
    model_options.kv_blocks = blocks;
    model_options.cuda_graphs = true;  // ignored on the CPU
    TorchEngineModel m(decoder, 256, model_options);
    Engine e(Options(2), &m, nullptr, 0);
    REQUIRE(e.Add("a", Prompt(1, 4), Greedy(3)).ok());
    CHECK(Run(&e).at("a").output.size() == 3);
    CHECK(m.paged() == (blocks > 0));
    CHECK(m.graph_replays() == 0);
  }
  TorchEngineModelOptions no_pool;
  no_pool.kv_layout = KvLayout::kPaged;
  TorchEngineModel m(decoder, 256, no_pool);
  Engine e(Options(2), &m, nullptr, 0);
  REQUIRE(e.Add("a", Prompt(1, 4), Greedy(3)).ok());
  const auto step = e.Step();
  CHECK(step.status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::engine
