// EpisodeDriver (services/rollout/episode_driver.h) on the engine over the
// deterministic toy model, against the real verifier daemon's calculator
// environment in process. The toy model's text is scripted through the
// codec (it cannot write JSON), but the calls are parsed by the real
// parser and answered by the real environment: a tool call, its
// observation appended as environment tokens, the answer scored reward 1;
// a weight update that lands while the episode waits for its environment
// shows in the version spans; a malformed call becomes an observation; the
// turn limit; an environment that fails to open and one that hangs end the
// episode cleanly while another request keeps generating.

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/rollout/episode_driver.h"
#include "tests/support/wait_for.h"
#include "tests/unit/episode_driver_rig.h"

namespace tandem::rollout {
namespace {

using namespace test;  // NOLINT: the rig's names
using tandem::testing::WaitFor;

TEST_CASE(
    "a calculator episode: a real parsed call, its observation as "
    "environment tokens, a weight update mid-episode, reward 1") {
  std::unique_ptr<verifier::Verifier> daemon = StartVerifier();
  EpisodeLimits limits;
  limits.max_turn_tokens = 4;
  Rig rig(daemon->grpc_address(), limits);
  rig.script = {
      "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", "
      "\"arguments\": {\"expression\": \"317*29\"}}\n</tool_call><|im_end|>",
      "9193<|im_end|>"};
  REQUIRE(rig.Start("task-1", 4).ok());
  engine::SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 40;
  REQUIRE(rig.engine.Add("other", {9, 9, 9}, plain).ok());
  bool staged = false;
  int32_t steps_with_episode_parked = 0;
  EpisodeResult r = rig.RunOne([&] {
    const engine::EngineSnapshot snap = rig.engine.Snapshot();
    if (snap.parked == 1 && snap.running == 1) ++steps_with_episode_parked;
    // The episode's first turn has ended: a new version arrives while it
    // waits for the environment.
    if (!staged && rig.engine.Snapshot().parked == 1) {
      rig.model.Stage(1);
      staged = true;
    }
  });
  CHECK(staged);
  INFO(r.end_text);
  CHECK(r.end_reason == "answered");
  REQUIRE(r.reward.has_value());
  CHECK(*r.reward == 1.0);
  CHECK(r.tool_calls == 1);
  CHECK(r.malformed_turns == 0);
  const engine::FinishedSample& s = r.sample;
  CHECK(s.turns == 2);
  // Turn 1 (4 tokens), the observation "9193" as rendered, turn 2 (4).
  const std::vector<int32_t> observation = Render({[] {
    tandem::v1::Observation o;
    o.set_content("9193");
    return o;
  }()});
  REQUIRE(s.output.size() == 4 + observation.size() + 4);
  CHECK(std::vector<int32_t>(s.output.begin() + 4,
                             s.output.begin() + 4 + observation.size()) ==
        observation);
  const bool sources_ok =
      s.source_spans == std::vector<engine::SourceSpan>{
                            {engine::TokenSource::kModel, 4},
                            {engine::TokenSource::kEnvironment,
                             static_cast<uint32_t>(observation.size())},
                            {engine::TokenSource::kModel, 4}};
  CHECK(sources_ok);
  // Turn 1 and the observation under v0, turn 2 under v1.
  const bool versions_ok =
      s.spans ==
      std::vector<engine::VersionSpan>{
          {0, static_cast<uint32_t>(4 + observation.size())}, {1, 4}};
  CHECK(versions_ok);
  for (size_t t = 4; t < 4 + observation.size(); ++t) {
    CHECK(s.logprobs[t] == 0.0f);
  }
  // The other request decoded while the episode waited, and finishes.
  CHECK(steps_with_episode_parked > 0);
  for (int i = 0; i < 100 && rig.others.empty(); ++i) {
    REQUIRE(rig.engine.Step().ok());
    for (auto& f : rig.engine.TakeFinished()) rig.others.push_back(f);
  }
  REQUIRE(rig.others.size() == 1);
  CHECK(rig.others[0].output.size() == 40);
  rig.client.Stop();
  daemon->GracefulStop(absl::Seconds(10));
}

TEST_CASE(
    "a malformed call becomes the turn's text; the turn limit ends an "
    "episode the environment would continue") {
  std::unique_ptr<verifier::Verifier> daemon = StartVerifier();
  {
    Rig rig(daemon->grpc_address(), EpisodeLimits{});
    rig.script = {
        "<tool_call>{\"name\": \"calculator\", \"arguments\": "
        "{\"expression\"</tool_call>"};
    REQUIRE(rig.Start("bad", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.malformed_turns == 1);
    CHECK(r.tool_calls == 0);
    // The calculator took the error text as the answer and scored it.
    CHECK(r.end_reason == "answered");
    REQUIRE(r.reward.has_value());
    CHECK(*r.reward == 0.0);
    CHECK(r.sample.turns == 1);
  }
  {
    EpisodeLimits limits;
    limits.max_turns = 1;
    Rig rig(daemon->grpc_address(), limits);
    rig.script = {
        "<tool_call>{\"name\": \"calculator\", \"arguments\": "
        "{\"expression\": \"1+1\"}}</tool_call>"};
    REQUIRE(rig.Start("limited", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "turn_limit");
    CHECK_THAT(r.end_text, Catch::Contains("max_turns 1"));
    CHECK_FALSE(r.reward.has_value());
    CHECK(r.tool_calls == 1);
    CHECK(r.sample.source_spans.empty());  // no observation was appended
  }
  daemon->GracefulStop(absl::Seconds(10));
}

TEST_CASE("a group of two samples runs two episodes") {
  std::unique_ptr<verifier::Verifier> daemon = StartVerifier();
  EpisodeLimits limits;
  limits.max_turn_tokens = 3;
  Rig rig(daemon->grpc_address(), limits);
  rig.script = {"9193", "9194"};
  EpisodeTask task;
  task.request_id = "group";
  task.prompt = {3, 4, 5};
  task.params.temperature = 1.0f;
  task.params.seed = 7;
  task.params.n = 2;
  task.open.set_environment("calculator");
  task.open.set_prompt_text("What is 317*29?");
  task.open.set_verifier("exact");
  (*task.open.mutable_metadata())["answer"] = "9193";
  REQUIRE(rig.driver.Start(task).ok());
  CHECK(rig.driver.Start(task).code() == absl::StatusCode::kInvalidArgument);
  std::vector<EpisodeResult> results = {rig.RunOne()};
  results.push_back(rig.RunOne());
  std::map<double, int> rewards;
  for (const EpisodeResult& r : results) {
    CHECK(r.end_reason == "answered");
    REQUIRE(r.reward.has_value());
    ++rewards[*r.reward];
  }
  // One sample's turn decoded as the right answer, the other's not.
  CHECK(rewards == std::map<double, int>{{0.0, 1}, {1.0, 1}});
  CHECK(results[0].sample.sample_index != results[1].sample.sample_index);
  CHECK(rig.driver.active() == 0);

  rig.client.Stop();
  daemon->GracefulStop(absl::Seconds(10));
}

TEST_CASE(
    "an environment that hangs or is gone ends the episode with a "
    "reason; the worker keeps generating") {
  HangingEnvironment service;
  LoopbackServer server(&service);
  {
    EnvironmentClientOptions options;
    options.step_timeout = absl::Milliseconds(300);
    Rig rig(server.address(), EpisodeLimits{}, options);
    rig.script = {"thinking"};
    REQUIRE(rig.Start("hang", 3).ok());
    engine::SamplingParams plain;
    plain.temperature = 0;
    plain.max_tokens = 30;
    REQUIRE(rig.engine.Add("other", {9, 9, 9}, plain).ok());
    const absl::Time start = absl::Now();
    EpisodeResult r = rig.RunOne();
    CHECK(absl::Now() - start < absl::Seconds(10));
    CHECK(r.end_reason == "environment_failed");
    CHECK_THAT(r.end_text, Catch::Contains("no answer after"));
    CHECK(rig.others.size() == 1);
    // The failed episode is closed.
    CHECK(WaitFor([&] { return service.closes >= 1; }, absl::Seconds(10)));
    CHECK(service.closes == 1);

    // Aborted while its open may still be in flight: closed once opened.
    REQUIRE(rig.Start("aborted", 50).ok());
    REQUIRE(rig.engine.Step().ok());
    CHECK(rig.engine.Abort("aborted") == 1);
    EpisodeResult aborted = rig.RunOne();
    CHECK(aborted.end_reason == "aborted");
    CHECK(WaitFor(
        [&] {
          rig.driver.Poll();
          return service.closes >= 2;
        },
        absl::Seconds(10)));
    CHECK(service.closes == 2);
  }
  {
    Rig rig("127.0.0.1:1", EpisodeLimits{});
    rig.script = {"thinking"};
    REQUIRE(rig.Start("gone", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment_failed");
    CHECK_THAT(r.end_text, Catch::Contains("OpenEpisode of environment"));
    CHECK(r.sample.output.size() == 3);
  }
}

TEST_CASE(
    "a reward outside [0, 1] ends the episode 'error' without it; done "
    "without a reason is the environment's own end") {
  RewardingEnvironment service;
  LoopbackServer server(&service);
  {
    Rig rig(server.address(), EpisodeLimits{});
    rig.script = {"7", "7", "7"};
    service.reward = 7.5;
    REQUIRE(rig.Start("generous", 3).ok());
    EpisodeResult made_up = rig.RunOne();
    CHECK(made_up.end_reason == "error");
    CHECK_FALSE(made_up.reward.has_value());
    CHECK_THAT(made_up.end_text,
               Catch::Contains("the environment's reward 7.5 is not finite "
                               "or outside the task's range [0, 1]; "
                               "dropped (judged)"));
    service.reward = std::nan("");
    REQUIRE(rig.Start("nan", 3).ok());
    EpisodeResult nan = rig.RunOne();
    CHECK(nan.end_reason == "error");
    CHECK_FALSE(nan.reward.has_value());
    service.reward = 0.5;
    REQUIRE(rig.Start("fair", 3).ok());
    EpisodeResult fair = rig.RunOne();
    CHECK(fair.end_reason == "environment");
    REQUIRE(fair.reward.has_value());
    CHECK(*fair.reward == 0.5);
    // A task with its own range (the dataset row's reward_range) takes a
    // penalty, and refuses what is outside its range.
    service.reward = -0.5;
    REQUIRE(rig.Start("penalised", 3, {-1.0, 1.0}).ok());
    EpisodeResult penalised = rig.RunOne();
    CHECK(penalised.end_reason == "environment");
    REQUIRE(penalised.reward.has_value());
    CHECK(*penalised.reward == -0.5);
    REQUIRE(rig.Start("default", 3).ok());
    EpisodeResult refused = rig.RunOne();
    CHECK(refused.end_reason == "error");
    service.reward = 1.5;
    REQUIRE(rig.Start("over", 3, {-1.0, 1.0}).ok());
    EpisodeResult over = rig.RunOne();
    CHECK(over.end_reason == "error");
    CHECK_THAT(over.end_text, Catch::Contains("outside the task's range "
                                              "[-1, 1]"));
  }
}

TEST_CASE(
    "opening observations to a worker that does not render them end the "
    "episode environment_failed, saying why, and close it") {
  RewardingEnvironment service;
  service.opening_observation = true;
  service.reward = 1.0;
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{});
  rig.script = {"7"};
  REQUIRE(rig.Start("maze", 3).ok());
  EpisodeResult r = rig.RunOne();
  CHECK(r.end_reason == "environment_failed");
  CHECK_FALSE(r.reward.has_value());
  CHECK_THAT(r.end_text,
             Catch::Contains("opened the episode with 1 observations before "
                             "the first turn"));
  CHECK(service.steps == 0);
  CHECK(WaitFor(
      [&] {
        rig.driver.Poll();
        return service.closed >= 1;
      },
      absl::Seconds(10)));
  CHECK(service.closed == 1);
}

TEST_CASE(
    "a turn stop string ends the turn at the token that wrote it, which it "
    "keeps") {
  RewardingEnvironment service;  // ends every episode at its first step
  service.reward = 1.0;
  LoopbackServer server(&service);
  const std::string address = server.address();
  std::vector<int32_t> probe;
  {
    // The toy model's greedy first turn of 16 tokens, with no stop string
    // that can match.
    Rig rig(address, EpisodeLimits{}, {}, {"not a letter string"});
    REQUIRE(rig.Start("probe", 16).ok());
    EpisodeResult r = rig.RunOne();
    probe = r.sample.output;
    REQUIRE(probe.size() == 16);
  }
  // A stop string of tokens 6..8 of that turn: the turn ends where it
  // first appears in the turn's text (one letter a token), at or before
  // token 8.
  const std::string text = Rig::DecodeLetters(probe);
  const std::string stop = text.substr(6, 3);
  const size_t end = text.find(stop) + stop.size();
  REQUIRE(end <= 9);
  {
    Rig rig(address, EpisodeLimits{}, {}, {"never", stop});
    REQUIRE(rig.Start("stopped", 16).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment");
    CHECK(r.sample.output ==
          std::vector<int32_t>(probe.begin(), probe.begin() + end));
  }
  {
    // The environment answers the stopped turn: the turn is closed with
    // the end-of-turn tokens, as the environment's, before its
    // observation.
    service.observe_first = true;
    Rig rig(address, EpisodeLimits{}, {}, {stop});
    REQUIRE(rig.Start("answered", 16).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment");
    REQUIRE(r.sample.output.size() > end + kTurnEnd.size());
    CHECK(std::vector<int32_t>(r.sample.output.begin(),
                               r.sample.output.begin() + end) ==
          std::vector<int32_t>(probe.begin(), probe.begin() + end));
    CHECK(std::vector<int32_t>(r.sample.output.begin() + end,
                               r.sample.output.begin() + end +
                                   kTurnEnd.size()) == kTurnEnd);
    std::vector<int32_t> observation = kTurnEnd;
    tandem::v1::Observation o;
    o.set_role("tool");
    o.set_content("42");
    for (int32_t t : Render({o})) observation.push_back(t);
    REQUIRE(r.sample.source_spans.size() >= 2);
    CHECK(r.sample.source_spans[0] ==
          engine::SourceSpan{engine::TokenSource::kModel,
                             static_cast<uint32_t>(end)});
    CHECK(r.sample.source_spans[1] ==
          engine::SourceSpan{engine::TokenSource::kEnvironment,
                             static_cast<uint32_t>(observation.size())});
  }
}

}  // namespace
}  // namespace tandem::rollout
