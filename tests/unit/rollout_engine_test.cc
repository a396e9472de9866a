#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "engine/engine.h"
#include "engine/generate_all.h"
#include "engine/sampler.h"
#include "tests/unit/toy_engine_model.h"

namespace tandem::engine {
namespace {

constexpr int32_t kVocab = 32;

SamplingParams Greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int32_t> Prompt(int32_t id, int32_t len) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((id * 7 + i * 3) % kVocab);
  return p;
}

// Runs the engine until idle; returns finished samples by request id.
std::map<std::string, std::vector<FinishedSample>> RunToEnd(Engine* engine) {
  std::map<std::string, std::vector<FinishedSample>> out;
  for (int step = 0; step < 100000 && !engine->idle(); ++step) {
    auto stats = engine->Step();
    REQUIRE(stats.ok());
    for (auto& s : engine->TakeFinished()) out[s.request_id].push_back(s);
  }
  REQUIRE(engine->idle());
  return out;
}

EngineOptions Options(int32_t blocks = 256, int32_t max_seqs = 8) {
  EngineOptions o;
  o.limits.max_num_seqs = max_seqs;
  o.limits.max_batched_tokens = 64;
  o.num_kv_blocks = blocks;
  o.block_size = 4;
  return o;
}

TEST_CASE("greedy tokens are the same alone and inside a continuous batch") {
  std::map<std::string, std::vector<int32_t>> alone;
  for (int r = 0; r < 6; ++r) {
    ToyModel model(kVocab);
    Engine engine(Options(), &model, nullptr, 0);
    REQUIRE(
        engine.Add("r" + std::to_string(r), Prompt(r, 3 + r), Greedy(5 + 3 * r))
            .ok());
    alone["r" + std::to_string(r)] =
        RunToEnd(&engine)["r" + std::to_string(r)][0].output;
  }
  ToyModel model(kVocab);
  Engine engine(Options(256, 3), &model, nullptr, 0);
  std::map<std::string, std::vector<int32_t>> batched;
  // Requests arrive while others run and finish.
  for (int r = 0; r < 6; ++r) {
    REQUIRE(
        engine.Add("r" + std::to_string(r), Prompt(r, 3 + r), Greedy(5 + 3 * r))
            .ok());
    for (int s = 0; s < 2; ++s) REQUIRE(engine.Step().ok());
    for (auto& f : engine.TakeFinished()) batched[f.request_id] = f.output;
  }
  for (auto& [id, samples] : RunToEnd(&engine)) batched[id] = samples[0].output;
  CHECK(model.max_batch_ > 1);
  CHECK(batched == alone);
}

TEST_CASE(
    "GenerateAll: samples in prompt then sample order, as each prompt alone; "
    "max_tokens cut to the sequence limit; a prompt without room refused") {
  std::vector<std::vector<int32_t>> prompts;
  for (int r = 0; r < 7; ++r) prompts.push_back(Prompt(r, 2 + r));
  GenerateAllOptions options;
  options.engine = Options(256, 3);  // fewer slots than prompts
  options.params = Greedy(6);
  options.params.n = 2;
  options.params.seed = 1;
  options.max_sequence_tokens = 10;
  ToyModel model(kVocab);
  auto samples = GenerateAll(&model, prompts, options);
  REQUIRE(samples.ok());
  REQUIRE(samples->size() == 14);
  for (size_t k = 0; k < samples->size(); ++k) {
    const FinishedSample& s = (*samples)[k];
    INFO("sample " << k);
    CHECK(s.request_id == std::to_string(k / 2));
    CHECK(s.sample_index == static_cast<int32_t>(k % 2));
    CHECK(s.prompt == prompts[k / 2]);
    // Prompt + output never passes the limit of 10 tokens.
    const size_t room = 10 - prompts[k / 2].size();
    CHECK(s.output.size() == std::min<size_t>(6, room));
    ToyModel alone_model(kVocab);
    Engine alone(Options(), &alone_model, nullptr, 0);
    SamplingParams one =
        Greedy(static_cast<int32_t>(std::min<size_t>(6, room)));
    REQUIRE(alone.Add("x", prompts[k / 2], one).ok());
    CHECK(RunToEnd(&alone)["x"][0].output == s.output);
  }
  prompts.push_back(Prompt(9, 10));
  auto refused = GenerateAll(&model, prompts, options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(
      std::string(refused.status().message()).find("prompt 7 has 10 tokens") !=
      std::string::npos);
}

TEST_CASE(
    "GenerateAll: per-prompt seeds sample as each prompt alone with its "
    "seed; a seed count that is not the prompt count is refused") {
  std::vector<std::vector<int32_t>> prompts = {Prompt(1, 3), Prompt(1, 3),
                                               Prompt(2, 4)};
  GenerateAllOptions options;
  options.params.temperature = 1.0f;
  options.params.max_tokens = 8;
  options.params.n = 2;
  options.seeds = {11, 12, 13};
  ToyModel model(kVocab);
  auto samples = GenerateAll(&model, prompts, options);
  REQUIRE(samples.ok());
  REQUIRE(samples->size() == 6);
  for (size_t p = 0; p < prompts.size(); ++p) {
    ToyModel alone_model(kVocab);
    Engine alone(Options(), &alone_model, nullptr, 0);
    SamplingParams one = options.params;
    one.seed = options.seeds[p];
    REQUIRE(alone.Add("x", prompts[p], one).ok());
    auto done = RunToEnd(&alone)["x"];
    REQUIRE(done.size() == 2);
    for (const FinishedSample& d : done) {
      INFO("prompt " << p << " sample " << d.sample_index);
      CHECK((*samples)[p * 2 + static_cast<size_t>(d.sample_index)].output ==
            d.output);
    }
  }
  // The same prompt under two seeds: the seeds were used.
  CHECK(((*samples)[0].output != (*samples)[2].output ||
         (*samples)[1].output != (*samples)[3].output));
  options.seeds = {1, 2};
  auto refused = GenerateAll(&model, prompts, options);
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("2 seeds for 3 prompts") !=
        std::string::npos);
}

TEST_CASE(
    "inflight swap: tokens carry v then v+1 and log-probs follow the new "
    "weights") {
  ToyModel model(kVocab);
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 42;
  params.max_tokens = 12;
  Engine engine(Options(), &model, &model, 0);
  const std::vector<int32_t> prompt = Prompt(1, 4);
  REQUIRE(engine.Add("a", prompt, params).ok());
  for (int s = 0; s < 5; ++s) REQUIRE(engine.Step().ok());
  model.Stage(1);
  auto step = engine.Step();
  REQUIRE(step.ok());
  CHECK(step->committed_update);
  CHECK(step->committed_version == 1);
  auto done = RunToEnd(&engine);
  const FinishedSample& s = done["a"][0];
  REQUIRE(s.spans.size() == 2);
  CHECK(s.spans[0] == VersionSpan{0, 5});
  CHECK(s.spans[1] == VersionSpan{1, 7});
  // Every log-prob matches the weights live when its token was sampled,
  // with the kept cache holding version-0 keys for the tokens before.
  uint64_t keys = 0;
  std::vector<int32_t> all = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) {
    keys += ToyModel::Key(prompt[i], static_cast<int32_t>(i), 0);
  }
  for (size_t t = 0; t < s.output.size(); ++t) {
    const uint64_t version = t < 5 ? 0 : 1;
    std::vector<float> logits(kVocab);
    model.Logits(keys, version, logits.data());
    double z = 0;
    for (float l : logits) z += std::exp(l);
    const double expected = logits[s.output[t]] - std::log(z);
    CHECK(s.logprobs[t] == Approx(expected).margin(1e-5));
    // Token t enters the cache one step after it is sampled, so its key
    // is computed under the version live for token t + 1.
    const uint64_t fed_under = t + 1 < 5 ? 0 : 1;
    keys += ToyModel::Key(s.output[t], static_cast<int32_t>(prompt.size() + t),
                          fed_under);
  }
}

TEST_CASE("kv_policy recompute rebuilds the cache under the new weights") {
  ToyModel model(kVocab);
  EngineOptions options = Options();
  options.kv_policy = EngineOptions::KvPolicy::kRecompute;
  Engine engine(options, &model, &model, 0);
  REQUIRE(engine.Add("a", Prompt(2, 4), Greedy(10)).ok());
  for (int s = 0; s < 4; ++s) REQUIRE(engine.Step().ok());
  const int64_t before = model.computed_tokens_;
  model.Stage(1);
  REQUIRE(engine.Step().ok());
  // prompt (4) + 4 generated tokens recomputed in one chunk.
  CHECK(model.computed_tokens_ - before == 8);
  const FinishedSample s = RunToEnd(&engine)["a"][0];
  // After the swap the tokens equal a fresh greedy run under version 1
  // continuing the same prefix.
  std::vector<int32_t> prefix = Prompt(2, 4);
  prefix.insert(prefix.end(), s.output.begin(), s.output.begin() + 4);
  for (size_t t = 4; t < s.output.size(); ++t) {
    auto logits = model.ReferenceLogits(prefix, 1);
    const int32_t best = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.end()) - logits.begin());
    CHECK(s.output[t] == best);
    prefix.push_back(s.output[t]);
  }
}

TEST_CASE("a full KV cache preempts and recomputes; nothing is lost") {
  // 12 blocks of 4 slots: 48 slots for 8 requests of up to 6+14 tokens.
  ToyModel model(kVocab);
  Engine engine(Options(12, 8), &model, nullptr, 0);
  std::map<std::string, std::vector<int32_t>> expected;
  for (int r = 0; r < 8; ++r) {
    const std::string id = "r" + std::to_string(r);
    REQUIRE(engine.Add(id, Prompt(r, 6), Greedy(14)).ok());
    ToyModel solo_model(kVocab);
    Engine solo(Options(), &solo_model, nullptr, 0);
    REQUIRE(solo.Add(id, Prompt(r, 6), Greedy(14)).ok());
    expected[id] = RunToEnd(&solo)[id][0].output;
  }
  auto done = RunToEnd(&engine);
  REQUIRE(done.size() == 8);
  uint32_t preemptions = 0;
  for (auto& [id, samples] : done) {
    REQUIRE(samples.size() == 1);
    CHECK(samples[0].output == expected[id]);
    CHECK(samples[0].finish_reason == FinishReason::kLength);
    preemptions += samples[0].preemptions;
  }
  CHECK(preemptions > 0);
  CHECK(engine.Snapshot().preemptions == preemptions);
  CHECK(engine.Snapshot().kv_blocks_used == 0);
}

TEST_CASE("n samples share one prompt prefill and differ by seed") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  SamplingParams params;
  params.n = 4;
  params.seed = 7;
  params.max_tokens = 6;
  REQUIRE(engine.Add("g", Prompt(3, 20), params).ok());
  auto done = RunToEnd(&engine);
  REQUIRE(done["g"].size() == 4);
  CHECK(model.forks_ == 3);
  // One 20-token prefill plus one token per sibling, plus decodes.
  CHECK(model.computed_tokens_ == 20 + 3 * 1 + 4 * 5);
  std::set<std::vector<int32_t>> distinct;
  for (auto& s : done["g"]) distinct.insert(s.output);
  CHECK(distinct.size() > 1);
}

TEST_CASE("report_tokens streams every sampled token in order, others none") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  SamplingParams served = Greedy(5);
  served.report_tokens = true;
  served.n = 2;
  REQUIRE(engine.Add("served", Prompt(1, 6), served).ok());
  REQUIRE(engine.Add("rollout", Prompt(2, 6), Greedy(5)).ok());
  std::map<int32_t, std::vector<int32_t>> streamed;
  std::map<std::string, std::vector<FinishedSample>> done;
  while (!engine.idle()) {
    REQUIRE(engine.Step().ok());
    for (const TokenEvent& e : engine.TakeTokenEvents()) {
      REQUIRE(e.request_id == "served");
      streamed[e.sample_index].push_back(e.token);
    }
    for (auto& s : engine.TakeFinished()) done[s.request_id].push_back(s);
  }
  REQUIRE(done["served"].size() == 2);
  for (const FinishedSample& s : done["served"]) {
    CHECK(streamed[s.sample_index] == s.output);
  }
}

TEST_CASE("Abort ends one sample or a whole request, siblings still run") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  SamplingParams params = Greedy(50);
  params.n = 3;
  REQUIRE(engine.Add("r", Prompt(4, 8), params).ok());
  REQUIRE(engine.Add("other", Prompt(5, 8), Greedy(4)).ok());
  // Abort the leader before it prefilled: its waiting siblings prefill
  // themselves instead of waiting forever for its cache.
  CHECK(engine.Abort("r", 0) == 1);
  CHECK(engine.Abort("missing") == 0);
  for (int i = 0; i < 3; ++i) REQUIRE(engine.Step().ok());
  CHECK(engine.Abort("r", 1) == 1);
  auto done = RunToEnd(&engine);
  REQUIRE(done["r"].size() == 3);
  std::map<int32_t, const FinishedSample*> by_index;
  for (const FinishedSample& s : done["r"]) by_index[s.sample_index] = &s;
  CHECK(by_index[0]->finish_reason == FinishReason::kAborted);
  CHECK(by_index[0]->output.empty());
  CHECK(by_index[1]->finish_reason == FinishReason::kAborted);
  CHECK(by_index[1]->output.size() < 50);
  CHECK(by_index[2]->finish_reason == FinishReason::kLength);
  CHECK(by_index[2]->output.size() == 50);
  CHECK(done["other"].size() == 1);
  CHECK(engine.Snapshot().kv_blocks_used == 0);
}

TEST_CASE("stop tokens end a sample with reason stop") {
  ToyModel model(kVocab);
  EngineOptions options = Options();
  Engine probe(options, &model, nullptr, 0);
  REQUIRE(probe.Add("p", Prompt(5, 3), Greedy(8)).ok());
  const auto tokens = RunToEnd(&probe)["p"][0].output;
  ToyModel model2(kVocab);
  options.eos_token_ids = {tokens[2]};
  Engine engine(options, &model2, nullptr, 0);
  REQUIRE(engine.Add("p", Prompt(5, 3), Greedy(8)).ok());
  const auto s = RunToEnd(&engine)["p"][0];
  const size_t first =
      std::find(tokens.begin(), tokens.end(), tokens[2]) - tokens.begin();
  CHECK(s.output.size() == first + 1);
  CHECK(s.finish_reason == FinishReason::kStop);
}

TEST_CASE("drain policy admits nothing until the batch empties, then commits") {
  ToyModel model(kVocab);
  EngineOptions options = Options();
  options.update_policy = EngineOptions::UpdatePolicy::kDrain;
  Engine engine(options, &model, &model, 0);
  REQUIRE(engine.Add("long", Prompt(1, 3), Greedy(10)).ok());
  REQUIRE(engine.Step().ok());
  model.Stage(1);
  REQUIRE(engine.Add("late", Prompt(2, 3), Greedy(3)).ok());
  int steps = 0;
  while (engine.Snapshot().policy_version == 0) {
    REQUIRE(engine.Step().ok());
    CHECK(engine.Snapshot().running <= 1);
    REQUIRE(++steps < 50);
  }
  auto done = RunToEnd(&engine);
  CHECK(done["late"][0].spans == std::vector<VersionSpan>{{1, 3}});
}

TEST_CASE("static batching admits only into an empty batch") {
  ToyModel model(kVocab);
  EngineOptions options = Options(256, 2);
  options.static_batching = true;
  Engine engine(options, &model, nullptr, 0);
  REQUIRE(engine.Add("short", Prompt(1, 3), Greedy(2)).ok());
  REQUIRE(engine.Add("long", Prompt(2, 3), Greedy(8)).ok());
  REQUIRE(engine.Add("next", Prompt(3, 3), Greedy(2)).ok());
  for (int s = 0; s < 4; ++s) REQUIRE(engine.Step().ok());
  // "short" finished long ago but "next" may not start before "long" ends.
  CHECK(engine.Snapshot().running == 1);
  CHECK(engine.Snapshot().waiting == 1);
  RunToEnd(&engine);
}

TEST_CASE("requests that can never fit are refused with a clear error") {
  ToyModel model(kVocab);
  Engine engine(Options(4, 8), &model, nullptr, 0);
  auto status = engine.Add("huge", Prompt(1, 10), Greedy(20));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("exceeds the whole KV cache"));
  CHECK(engine.Add("empty", {}, Greedy(2)).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "sampler: top_k 1 is greedy, log-probs are log-softmax, seeds repeat") {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.top_k = 1;
  auto s = SampleToken(logits.data(), 4, p, &rng);
  CHECK(s.token == 1);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  CHECK(s.logprob == Approx(2.0 - std::log(z)).margin(1e-6));
  SamplingParams hot;
  hot.temperature = 0.5f;
  std::mt19937_64 a(9), b(9);
  for (int i = 0; i < 20; ++i) {
    auto x = SampleToken(logits.data(), 4, hot, &a);
    auto y = SampleToken(logits.data(), 4, hot, &b);
    CHECK(x.token == y.token);
    double zt = 0;
    for (float l : logits) zt += std::exp(l / 0.5);
    CHECK(x.logprob ==
          Approx(logits[x.token] / 0.5 - std::log(zt)).margin(1e-5));
  }
  SamplingParams nucleus;
  nucleus.top_p = 0.5f;  // only token 1 (p ~ 0.53) survives
  std::mt19937_64 c(3);
  for (int i = 0; i < 20; ++i) {
    CHECK(SampleToken(logits.data(), 4, nucleus, &c).token == 1);
  }
}

}  // namespace
}  // namespace tandem::engine
