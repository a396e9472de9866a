// Engine unit tests of the multi-turn turn boundary (engine/engine_turns.cc):
// a sequence whose turn ends is parked with its KV cache, resumed with the
// environment's tokens (prefilled as one chunk, never the earlier turns
// again), and ends with source spans, versions and log-probs for every
// token; other sequences run while it is parked; parked sequences can be
// aborted, lose their cache first under memory pressure, and see a weight
// commit between turns as the next turn's version; opening tokens (an
// episode's opening observations) come before the first turn.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>

#include "engine/engine.h"
#include "tests/unit/toy_engine_model.h"

namespace tandem::engine {
namespace {

constexpr int32_t kVocab = 32;

EngineOptions Options(int32_t blocks = 256, int32_t max_seqs = 8) {
  EngineOptions o;
  o.limits.max_num_seqs = max_seqs;
  o.limits.max_batched_tokens = 64;
  o.num_kv_blocks = blocks;
  o.block_size = 4;
  return o;
}

SamplingParams Turns(int32_t first_turn_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = first_turn_tokens;
  p.park_at_turn_end = true;
  return p;
}

std::vector<int32_t> Prompt(int32_t id, int32_t len) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((id * 7 + i * 3) % kVocab);
  return p;
}

// Steps until `request` parks or finishes; returns its parked turn.
ParkedTurn StepUntilParked(Engine* engine, const std::string& request,
                           std::vector<FinishedSample>* finished = nullptr) {
  for (int step = 0; step < 1000; ++step) {
    REQUIRE(engine->Step().ok());
    for (auto& f : engine->TakeFinished()) {
      if (finished != nullptr) finished->push_back(std::move(f));
    }
    for (ParkedTurn& t : engine->TakeParked()) {
      if (t.request_id == request) return t;
    }
  }
  FAIL("request " << request << " never parked");
  return {};
}

FinishedSample RunUntilFinished(Engine* engine, const std::string& request) {
  for (int step = 0; step < 1000; ++step) {
    REQUIRE(engine->Step().ok());
    for (auto& f : engine->TakeFinished()) {
      if (f.request_id == request) return f;
    }
  }
  FAIL("request " << request << " never finished");
  return {};
}

// Greedy token and its log-prob after a cache whose keys sum to `keys`.
std::pair<int32_t, double> Greedy(const ToyModel& model, uint64_t keys,
                                  uint64_t seed) {
  std::vector<float> logits(kVocab);
  model.Logits(keys, seed, logits.data());
  int32_t best = 0;
  for (int32_t v = 1; v < kVocab; ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  double z = 0;
  for (float l : logits) z += std::exp(l);
  return {best, logits[best] - std::log(z)};
}

// Checks every model token of `s` against greedy decoding of the toy model
// where the key of position i was computed under `seed_of(i)` and the
// logits of position i under `logit_seed(i)`; only output tokens
// [first, last) are checked.
template <typename SeedOf, typename LogitSeed>
void CheckModelTokens(const ToyModel& model, const FinishedSample& s,
                      SeedOf seed_of, LogitSeed logit_seed, size_t first = 0,
                      size_t last = SIZE_MAX) {
  std::vector<int32_t> all = s.prompt;
  all.insert(all.end(), s.output.begin(), s.output.end());
  std::vector<bool> is_model(s.output.size(), true);
  size_t at = 0;
  for (const SourceSpan& span : s.source_spans) {
    for (uint32_t k = 0; k < span.num_tokens; ++k) {
      is_model[at++] = span.source == TokenSource::kModel;
    }
  }
  uint64_t keys = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i >= s.prompt.size()) {
      const size_t t = i - s.prompt.size();
      if (t < first || t >= last) {
        // not checked
      } else if (is_model[t]) {
        auto [token, logprob] = Greedy(model, keys, logit_seed(i));
        INFO("output token " << t);
        CHECK(s.output[t] == token);
        CHECK(s.logprobs[t] == Approx(logprob).margin(1e-5));
      } else {
        CHECK(s.logprobs[t] == 0.0f);
      }
    }
    keys += ToyModel::Key(all[i], static_cast<int32_t>(i), seed_of(i));
  }
}

TEST_CASE(
    "park/resume keeps the cache: only the environment's tokens are "
    "prefilled, spans cover every token") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  const std::vector<int32_t> prompt = Prompt(1, 6);
  REQUIRE(engine.Add("a", prompt, Turns(4)).ok());
  ParkedTurn first = StepUntilParked(&engine, "a");
  CHECK(first.reason == FinishReason::kLength);
  CHECK(first.turn == 1);
  CHECK(first.turn_start == 0);
  CHECK(first.turn_tokens.size() == 4);
  CHECK(engine.Snapshot().parked == 1);
  CHECK(engine.Snapshot().running == 0);
  CHECK(engine.Snapshot().kv_blocks_used > 0);  // the cache is kept
  CHECK(engine.idle());
  const int64_t computed_before = model.computed_tokens_;
  CHECK(computed_before == 6 + 3);  // the turn's last token is not fed yet

  const std::vector<int32_t> env = {5, 9, 11};
  REQUIRE(engine.Resume("a", 0, env, 3).ok());
  CHECK_FALSE(engine.idle());
  ParkedTurn second = StepUntilParked(&engine, "a");
  CHECK(second.turn == 2);
  CHECK(second.turn_start == 7);
  CHECK(second.turn_tokens.size() == 3);
  REQUIRE(engine.EndEpisode("a", 0).ok());
  std::vector<FinishedSample> done = engine.TakeFinished();
  REQUIRE(done.size() == 1);
  const FinishedSample& s = done[0];
  CHECK(s.finish_reason == FinishReason::kStop);
  CHECK(s.turns == 2);
  REQUIRE(s.output.size() == 10);
  CHECK(std::vector<int32_t>(s.output.begin() + 4, s.output.begin() + 7) ==
        env);
  CHECK(s.source_spans ==
        std::vector<SourceSpan>{{TokenSource::kModel, 4},
                                {TokenSource::kEnvironment, 3},
                                {TokenSource::kModel, 3}});
  CHECK(s.spans == std::vector<VersionSpan>{{0, 10}});
  // Each token was computed once: the earlier turn was never prefilled again.
  CHECK(model.computed_tokens_ == 6 + 10 - 1);
  CheckModelTokens(
      model, s, [](size_t) { return 0; }, [](size_t) { return 0; });
  CHECK(engine.Snapshot().kv_blocks_used == 0);
}

TEST_CASE(
    "a stop token parks with reason stop; a single-turn sample has no "
    "source spans") {
  // Learn the greedy tokens, then make a later one that did not occur
  // before it a stop token.
  ToyModel probe_model(kVocab);
  Engine probe(Options(), &probe_model, nullptr, 0);
  SamplingParams single = Turns(8);
  single.park_at_turn_end = false;
  REQUIRE(probe.Add("p", Prompt(2, 5), single).ok());
  FinishedSample plain = RunUntilFinished(&probe, "p");
  CHECK(plain.source_spans.empty());
  CHECK(plain.turns == 1);
  size_t k = 2;
  while (k < plain.output.size() &&
         std::find(plain.output.begin(), plain.output.begin() + k,
                   plain.output[k]) != plain.output.begin() + k) {
    ++k;
  }
  REQUIRE(k < plain.output.size());
  const int32_t stop = plain.output[k];
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  SamplingParams p = Turns(8);
  p.stop_token_ids = {stop};
  REQUIRE(engine.Add("p", Prompt(2, 5), p).ok());
  ParkedTurn turn = StepUntilParked(&engine, "p");
  CHECK(turn.reason == FinishReason::kStop);
  CHECK(turn.turn_tokens == std::vector<int32_t>(plain.output.begin(),
                                                 plain.output.begin() + k + 1));
}

TEST_CASE("other sequences keep decoding while one is parked") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  REQUIRE(engine.Add("episode", Prompt(3, 5), Turns(2)).ok());
  SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 12;
  REQUIRE(engine.Add("other", Prompt(4, 5), plain).ok());
  std::vector<FinishedSample> finished;
  StepUntilParked(&engine, "episode", &finished);
  // The environment takes its time: the other request runs to its end.
  const int32_t forward_calls = model.forward_calls_;
  FinishedSample other = RunUntilFinished(&engine, "other");
  CHECK(other.output.size() == 12);
  CHECK(model.forward_calls_ - forward_calls >= 9);
  CHECK(engine.Snapshot().parked == 1);
  CHECK(engine.idle());
  REQUIRE(engine.Resume("episode", 0, {1, 2}, 2).ok());
  StepUntilParked(&engine, "episode");
  REQUIRE(engine.EndEpisode("episode", 0).ok());
  auto done = engine.TakeFinished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].output.size() == 6);
}

TEST_CASE("a parked sequence is aborted with its tokens and frees its blocks") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  REQUIRE(engine.Add("a", Prompt(5, 7), Turns(3)).ok());
  StepUntilParked(&engine, "a");
  CHECK(engine.Snapshot().kv_blocks_used > 0);
  CHECK(engine.Abort("a") == 1);
  auto done = engine.TakeFinished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].finish_reason == FinishReason::kAborted);
  CHECK(done[0].output.size() == 3);
  CHECK(engine.Snapshot().kv_blocks_used == 0);
  CHECK(engine.Snapshot().parked == 0);
  CHECK(engine.Resume("a", 0, {1}, 2).code() == absl::StatusCode::kNotFound);
}

TEST_CASE(
    "a weight commit between turns: the next turn carries the new "
    "version over the kept cache") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, &model, 0);
  const std::vector<int32_t> prompt = Prompt(6, 5);
  REQUIRE(engine.Add("a", prompt, Turns(3)).ok());
  StepUntilParked(&engine, "a");
  model.Stage(1);
  auto step = engine.Step();  // nothing runs; the update commits anyway
  REQUIRE(step.ok());
  CHECK(step->committed_version == 1);
  const int64_t computed = model.computed_tokens_;
  REQUIRE(engine.Resume("a", 0, {7, 8}, 4).ok());
  StepUntilParked(&engine, "a");
  REQUIRE(engine.EndEpisode("a", 0).ok());
  const FinishedSample s = engine.TakeFinished().at(0);
  // The environment's tokens carry the version of the turn before them.
  CHECK(s.spans == std::vector<VersionSpan>{{0, 5}, {1, 4}});
  // Only the last turn-1 token, the environment's and turn 2's were fed.
  CHECK(model.computed_tokens_ - computed == 1 + 2 + 3);
  // Keys up to turn 1's last token were computed under v0, the rest under
  // v1; turn 1 was sampled under v0 and turn 2 under v1.
  const size_t first_v1_key = prompt.size() + 2;
  CheckModelTokens(
      model, s, [&](size_t i) { return i < first_v1_key ? 0 : 1; },
      [&](size_t i) { return i < prompt.size() + 3 ? 0 : 1; });
}

TEST_CASE(
    "kv_policy recompute drops a parked cache at a commit and rebuilds "
    "it under the new weights") {
  ToyModel model(kVocab);
  EngineOptions o = Options();
  o.kv_policy = EngineOptions::KvPolicy::kRecompute;
  Engine engine(o, &model, &model, 0);
  const std::vector<int32_t> prompt = Prompt(7, 5);
  REQUIRE(engine.Add("a", prompt, Turns(3)).ok());
  StepUntilParked(&engine, "a");
  model.Stage(1);
  REQUIRE(engine.Step().ok());
  CHECK(engine.Snapshot().kv_blocks_used == 0);
  const int64_t computed = model.computed_tokens_;
  REQUIRE(engine.Resume("a", 0, {7, 8}, 4).ok());
  StepUntilParked(&engine, "a");
  REQUIRE(engine.EndEpisode("a", 0).ok());
  const FinishedSample s = engine.TakeFinished().at(0);
  CHECK(model.computed_tokens_ - computed == 5 + 3 + 2 + 3);
  REQUIRE(s.output.size() == 3 + 2 + 4);
  CHECK(s.spans == std::vector<VersionSpan>{{0, 5}, {1, 4}});
  // Turn 1 was sampled under v0 over v0 keys; turn 2 under v1 over a cache
  // rebuilt entirely under v1.
  CheckModelTokens(
      model, s, [](size_t) { return 0; }, [](size_t) { return 0; }, 0, 3);
  CheckModelTokens(
      model, s, [](size_t) { return 1; }, [](size_t) { return 1; }, 5, 9);
}

TEST_CASE(
    "under memory pressure a parked cache is reclaimed first and "
    "recomputed on resume with the same tokens") {
  // Reference: the episode alone, no pressure.
  auto run_episode = [](int32_t blocks, bool with_pressure,
                        uint32_t* preemptions, int64_t* recomputed) {
    ToyModel model(kVocab);
    Engine engine(Options(blocks, 8), &model, nullptr, 0);
    REQUIRE(engine.Add("a", Prompt(8, 8), Turns(4)).ok());
    StepUntilParked(&engine, "a");
    const int64_t before = model.computed_tokens_;
    if (with_pressure) {
      SamplingParams big;
      big.temperature = 0;
      big.max_tokens = 20;
      // 8 + 20 tokens need 7 blocks of 4: more than the 9 - 3 that the
      // parked episode leaves free.
      REQUIRE(engine.Add("b", Prompt(9, 8), big).ok());
      RunUntilFinished(&engine, "b");
    }
    REQUIRE(engine.Resume("a", 0, {3, 4}, 3).ok());
    StepUntilParked(&engine, "a");
    REQUIRE(engine.EndEpisode("a", 0).ok());
    FinishedSample s = engine.TakeFinished().at(0);
    *preemptions = s.preemptions;
    *recomputed = model.computed_tokens_ - before;
    return s.output;
  };
  uint32_t calm_preemptions = 0, pressed_preemptions = 0;
  int64_t calm_computed = 0, pressed_computed = 0;
  const std::vector<int32_t> calm =
      run_episode(64, false, &calm_preemptions, &calm_computed);
  const std::vector<int32_t> pressed =
      run_episode(9, true, &pressed_preemptions, &pressed_computed);
  CHECK(pressed == calm);
  CHECK(calm_preemptions == 0);
  CHECK(pressed_preemptions == 1);
  // Without pressure the resume fed 1 + 2 + 2 tokens; after the eviction
  // the prompt and turn 1 were fed again (b's 8 + 19 on top).
  CHECK(calm_computed == 5);
  CHECK(pressed_computed == 27 + 8 + 4 + 2 + 2);
}

TEST_CASE("EndTurn parks a running turn; misuse is a clear error") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, nullptr, 0);
  REQUIRE(engine.Add("a", Prompt(10, 4), Turns(10)).ok());
  SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 10;
  REQUIRE(engine.Add("b", Prompt(11, 4), plain).ok());
  for (int s = 0; s < 3; ++s) REQUIRE(engine.Step().ok());
  CHECK(engine.EndTurn("b", 0).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(engine.Resume("a", 0, {}, 2).code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(engine.EndTurn("a", 0).ok());
  std::vector<ParkedTurn> parked = engine.TakeParked();
  REQUIRE(parked.size() == 1);
  CHECK(parked[0].reason == FinishReason::kStop);
  CHECK(parked[0].turn_tokens.size() == 3);
  CHECK(engine.EndTurn("a", 0).code() == absl::StatusCode::kFailedPrecondition);
  absl::Status too_big = engine.Resume("a", 0, {}, 5000);
  CHECK(too_big.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(too_big.message()),
             Catch::Contains("exceed the whole KV cache"));
  CHECK(engine.Resume("zz", 0, {}, 2).code() == absl::StatusCode::kNotFound);
  // An empty observation continues the same turn's context.
  REQUIRE(engine.Resume("a", 0, {}, 2).ok());
  StepUntilParked(&engine, "a");
  REQUIRE(engine.EndEpisode("a", 0, FinishReason::kLength).ok());
  std::vector<FinishedSample> done = engine.TakeFinished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].finish_reason == FinishReason::kLength);
  CHECK(done[0].output.size() == 5);
  CHECK(done[0].source_spans.empty());
}

TEST_CASE(
    "opening tokens follow the prompt before the first turn: each sample its "
    "own, the prompt's prefill shared, the turn the same as after a prompt "
    "that held them") {
  ToyModel model(kVocab);
  Engine engine(Options(), &model, &model, 3);
  const std::vector<int32_t> prompt = Prompt(1, 9);
  const std::vector<std::vector<int32_t>> opening = {{5, 6, 7}, {8, 9}};
  SamplingParams params = Turns(4);
  params.n = 2;
  REQUIRE(engine.Add("r", prompt, params, opening).ok());
  std::map<int32_t, ParkedTurn> turns;
  for (int step = 0; step < 1000 && turns.size() < 2; ++step) {
    REQUIRE(engine.Step().ok());
    for (ParkedTurn& t : engine.TakeParked()) turns[t.sample_index] = t;
  }
  REQUIRE(turns.size() == 2);
  // The reference: each opening written into the prompt itself.
  ToyModel plain_model(kVocab);
  Engine plain(Options(), &plain_model, &plain_model, 3);
  for (int32_t i = 0; i < 2; ++i) {
    std::vector<int32_t> whole = prompt;
    whole.insert(whole.end(), opening[i].begin(), opening[i].end());
    REQUIRE(plain.Add("p" + std::to_string(i), whole, Turns(4)).ok());
    const ParkedTurn ref = StepUntilParked(&plain, "p" + std::to_string(i));
    const ParkedTurn& got = turns[i];
    CHECK(got.turn == 1);
    CHECK(got.turn_start == static_cast<int32_t>(opening[i].size()));
    CHECK(got.turn_tokens == ref.turn_tokens);
    REQUIRE(engine.EndEpisode("r", i).ok());
  }
  std::vector<FinishedSample> done = engine.TakeFinished();
  REQUIRE(done.size() == 2);
  for (const FinishedSample& f : done) {
    const std::vector<int32_t>& mine = opening[f.sample_index];
    const uint32_t env = static_cast<uint32_t>(mine.size());
    CHECK(f.prompt == prompt);
    CHECK(std::vector<int32_t>(f.output.begin(), f.output.begin() + env) ==
          mine);
    CHECK(f.source_spans ==
          std::vector<SourceSpan>{
              {TokenSource::kEnvironment, env},
              {TokenSource::kModel,
               static_cast<uint32_t>(f.output.size()) - env}});
    for (uint32_t k = 0; k < env; ++k) CHECK(f.logprobs[k] == 0.0f);
    CHECK(f.logprobs[env] < 0.0f);
    // The opening carries the version live at Add, like the turn after it.
    CHECK(f.spans == std::vector<VersionSpan>{
                         {3, static_cast<uint32_t>(f.output.size())}});
  }
  // One run per sample or none; the longest must fit with the prompt.
  CHECK(engine.Add("bad", prompt, params, {{1}}).code() ==
        absl::StatusCode::kInvalidArgument);
  const absl::Status huge =
      engine.Add("huge", prompt, params, {{1}, std::vector<int32_t>(2000, 1)});
  CHECK(huge.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(huge.message()),
             Catch::Contains("opening (2000 tokens)"));
}

}  // namespace
}  // namespace tandem::engine
