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

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/rollout/episode_driver.h"
#include "services/verifier/verifier.h"
#include "tests/unit/toy_engine_model.h"

namespace tandem::rollout {
namespace {

constexpr int32_t kVocab = 64;
// The end-of-turn tokens a turn ended by a stop string is closed with.
const std::vector<int32_t> kTurnEnd = {62, 63};

std::unique_ptr<verifier::Verifier> StartVerifier() {
  verifier::VerifierConfig config;
  config.server.metrics_address = "";
  config.coordinator_address = "127.0.0.1:1";  // nobody: retried in background
  config.worker_threads = 2;
  auto created = verifier::Verifier::Create(config);
  REQUIRE(created.ok());
  REQUIRE((*created)->Start().ok());
  return *std::move(created);
}

std::vector<int32_t> Render(const std::vector<tandem::v1::Observation>& obs) {
  std::vector<int32_t> tokens;
  for (const auto& o : obs) {
    tokens.push_back(1);  // a stand-in for the tool message header
    for (unsigned char c : o.content()) tokens.push_back(2 + c % (kVocab - 2));
  }
  return tokens;
}

// The stand-in chat template's generation header, and its rendering of
// opening observations (each as Render, then the header).
const std::vector<int32_t> kHeader = {60, 61};
std::vector<int32_t> RenderOpening(
    const std::vector<tandem::v1::Observation>& obs) {
  std::vector<int32_t> tokens = Render(obs);
  tokens.insert(tokens.end(), kHeader.begin(), kHeader.end());
  return tokens;
}

// A test's own Environment service on a loopback port-0 server, shut down
// when it goes out of scope (calls still running are cancelled after 2 s).
// `service` outlives it.
class LoopbackServer {
 public:
  explicit LoopbackServer(grpc::Service* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
  }
  ~LoopbackServer() {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// The engine, a driver and a scripted codec: the i-th decoded turn is
// script[i].
struct Rig {
  engine::ToyModel model{kVocab};
  engine::Engine engine;
  std::shared_ptr<grpc::Channel> channel;
  EnvironmentClient client;
  std::vector<std::string> script;
  size_t next_turn = 0;
  std::vector<std::string> decoded;
  EpisodeDriver driver;
  std::vector<engine::FinishedSample> others;
  std::deque<EpisodeResult> ready;

  // `turn_stops`: the codec's turn stop strings; with them, text is decoded
  // token by token (DecodeLetters), not from the script.
  Rig(const std::string& address, EpisodeLimits limits,
      EnvironmentClientOptions options = {},
      std::vector<std::string> turn_stops = {}, bool openings = false)
      : engine(Options(), &model, &model, 0),
        channel(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        client(channel, address, options),
        driver(&engine, &client, MakeCodec(std::move(turn_stops), openings),
               chat::ToolCallFormat::kHermes, limits) {}

  // `openings`: the codec renders opening observations (RenderOpening:
  // each as Render does, then kHeader) after a prompt without kHeader.
  EpisodeCodec MakeCodec(std::vector<std::string> turn_stops, bool openings) {
    EpisodeCodec codec{
        [this, letters = !turn_stops.empty()](
            const std::vector<int32_t>& tokens) {
          if (letters) return DecodeLetters(tokens);
          decoded.push_back(next_turn < script.size()
                                ? script[next_turn]
                                : std::string("no more script"));
          ++next_turn;
          return decoded.back();
        },
        [](const std::vector<tandem::v1::Observation>& obs)
            -> absl::StatusOr<std::vector<int32_t>> { return Render(obs); },
        turn_stops, kTurnEnd};
    if (openings) {
      codec.render_opening = [](const std::vector<tandem::v1::Observation>&
                                    obs)
          -> absl::StatusOr<std::vector<int32_t>> {
        return RenderOpening(obs);
      };
      codec.generation_header = kHeader;
    }
    return codec;
  }

  // One letter a token.
  static std::string DecodeLetters(const std::vector<int32_t>& tokens) {
    std::string text;
    for (int32_t t : tokens) text.push_back(static_cast<char>('a' + t % 26));
    return text;
  }

  static engine::EngineOptions Options() {
    engine::EngineOptions o;
    o.limits.max_num_seqs = 8;
    o.limits.max_batched_tokens = 64;
    o.num_kv_blocks = 256;
    o.block_size = 4;
    return o;
  }

  absl::Status Start(const std::string& id, int32_t first_turn_tokens,
                     environment::RewardRange reward_range = {},
                     std::vector<int32_t> prompt = {3, 4, 5, 6, 7},
                     int32_t n = 1) {
    EpisodeTask task;
    task.reward_range = reward_range;
    task.request_id = id;
    task.prompt = std::move(prompt);
    task.params.n = n;
    task.params.temperature = 0;
    task.params.max_tokens = first_turn_tokens;
    task.open.set_environment("calculator");
    task.open.set_task_id(id);
    task.open.set_prompt_text("What is 317*29?");
    task.open.set_verifier("exact");
    (*task.open.mutable_metadata())["answer"] = "9193";
    return driver.Start(std::move(task));
  }

  // Steps the engine and the driver until an episode finishes (episodes
  // that finish in the same step are returned by the next calls); the
  // sampled tokens go to OnTokens as the rollout worker's loop does.
  EpisodeResult RunOne(const std::function<void()>& on_step = {}) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      if (!ready.empty()) {
        EpisodeResult r = std::move(ready.front());
        ready.pop_front();
        return r;
      }
      REQUIRE(engine.Step().ok());
      driver.OnTokens(engine.TakeTokenEvents());
      driver.Poll();
      for (auto& f : engine.TakeFinished()) {
        if (!driver.OnFinished(f)) others.push_back(std::move(f));
      }
      for (EpisodeResult& r : driver.TakeFinished()) {
        ready.push_back(std::move(r));
      }
      if (!ready.empty()) continue;
      if (on_step) on_step();
      if (engine.idle()) client.WaitForReply(absl::Milliseconds(10));
    }
    FAIL("no episode finished in 30 s");
    return {};
  }
};

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

// Opens episodes, then never answers a Step (until cancelled).
class HangingEnvironment : public tandem::v1::Environment::CallbackService {
 public:
  grpc::ServerUnaryReactor* OpenEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::OpenEpisodeRequest*,
      tandem::v1::OpenEpisodeResponse* response) override {
    response->set_episode_id("hang-1");
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* CloseEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::CloseEpisodeRequest* request,
      tandem::v1::CloseEpisodeResponse* response) override {
    if (request->episode_id() == "hang-1") ++closes;
    response->set_existed(true);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::atomic<int> closes{0};
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext*,
                                 const tandem::v1::StepRequest*,
                                 tandem::v1::StepResponse*) override {
    class Hanging : public grpc::ServerUnaryReactor {
     public:
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }
    };
    return new Hanging;
  }
};

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
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (service.closes < 1 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    CHECK(service.closes == 1);

    // Aborted while its open may still be in flight: closed once opened.
    REQUIRE(rig.Start("aborted", 50).ok());
    REQUIRE(rig.engine.Step().ok());
    CHECK(rig.engine.Abort("aborted") == 1);
    EpisodeResult aborted = rig.RunOne();
    CHECK(aborted.end_reason == "aborted");
    const absl::Time give_up2 = absl::Now() + absl::Seconds(10);
    while (service.closes < 2 && absl::Now() < give_up2) {
      rig.driver.Poll();
      absl::SleepFor(absl::Milliseconds(10));
    }
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

// Ends every episode at its first Step with `reward` and no end reason.
class RewardingEnvironment : public tandem::v1::Environment::CallbackService {
 public:
  grpc::ServerUnaryReactor* OpenEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::OpenEpisodeRequest*,
      tandem::v1::OpenEpisodeResponse* response) override {
    response->set_episode_id(absl::StrCat("r-", ++opened));
    if (opening_observation) {
      tandem::v1::Observation* o = response->add_observations();
      o->set_role("user");
      // numbered_opening: each episode its own room (a randomised reset).
      o->set_content(numbered_opening
                         ? absl::StrCat("You are in room ", opened.load())
                         : std::string("You are in a maze."));
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const tandem::v1::StepRequest*,
                                 tandem::v1::StepResponse* response) override {
    // With observe_first, every other step (the first of each episode,
    // one episode at a time) answers with a tool observation instead.
    if (observe_first && steps++ % 2 == 0) {
      tandem::v1::Observation* o = response->add_observations();
      o->set_role("tool");
      o->set_content("42");
    } else {
      response->set_done(true);
      response->set_reward(reward);
      response->set_end_text("judged");
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* CloseEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::CloseEpisodeRequest*,
      tandem::v1::CloseEpisodeResponse* response) override {
    response->set_existed(true);
    ++closed;
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::atomic<int> opened{0};
  std::atomic<int> closed{0};
  std::atomic<bool> opening_observation{false};
  std::atomic<bool> numbered_opening{false};
  std::atomic<double> reward{0.0};
  std::atomic<bool> observe_first{false};
  std::atomic<int> steps{0};
};

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
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (service.closed < 1 && absl::Now() < give_up) {
    rig.driver.Poll();
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(service.closed == 1);
}

// `r` begins with `opening` as the environment's (log-prob 0), then the
// model's tokens.
void CheckOpening(const EpisodeResult& r, const std::vector<int32_t>& opening) {
  REQUIRE(r.sample.output.size() > opening.size());
  CHECK(std::vector<int32_t>(r.sample.output.begin(),
                             r.sample.output.begin() +
                                 static_cast<std::ptrdiff_t>(opening.size())) ==
        opening);
  REQUIRE(r.sample.source_spans.size() >= 2);
  CHECK(r.sample.source_spans[0] ==
        engine::SourceSpan{engine::TokenSource::kEnvironment,
                           static_cast<uint32_t>(opening.size())});
  CHECK(r.sample.source_spans[1].source == engine::TokenSource::kModel);
  for (size_t k = 0; k < opening.size(); ++k) {
    CHECK(r.sample.logprobs[k] == 0.0f);
  }
  // The model's first token has a real log-prob (the toy model is not
  // certain of anything).
  CHECK(r.sample.logprobs[opening.size()] < 0.0f);
}

std::vector<int32_t> OpeningFor(const std::string& content) {
  tandem::v1::Observation o;
  o.set_role("user");
  o.set_content(content);
  return RenderOpening({o});
}

TEST_CASE(
    "opening observations come before the first model token as the "
    "environment's, each sample its own, after a prompt without the "
    "generation header") {
  RewardingEnvironment service;
  service.opening_observation = true;
  service.numbered_opening = true;
  service.reward = 1.0;
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
  rig.script = {"7", "7"};
  REQUIRE(rig.Start("rooms", 3, {}, {3, 4, 5, 6, 7}, /*n=*/2).ok());
  std::vector<EpisodeResult> results;
  results.push_back(rig.RunOne());
  results.push_back(rig.RunOne());
  std::set<std::vector<int32_t>> openings;
  for (const EpisodeResult& r : results) {
    CHECK(r.end_reason == "environment");
    REQUIRE(r.reward.has_value());
    CHECK(*r.reward == 1.0);
    CHECK(r.sample.prompt == std::vector<int32_t>{3, 4, 5, 6, 7});
    CHECK(r.sample.turns == 1);
    // Which sample's open answered first is up to the server.
    const std::vector<int32_t> one = OpeningFor("You are in room 1");
    const std::vector<int32_t> two = OpeningFor("You are in room 2");
    const std::vector<int32_t>& mine =
        std::equal(one.begin(), one.end(), r.sample.output.begin()) ? one
                                                                    : two;
    CheckOpening(r, mine);
    openings.insert(mine);
    // The sample's version spans cover the opening too.
    uint32_t covered = 0;
    for (const engine::VersionSpan& v : r.sample.spans) covered += v.num_tokens;
    CHECK(covered == r.sample.output.size());
  }
  CHECK(openings.size() == 2);
}

TEST_CASE(
    "no opening observations: a prompt with the generation header gives the "
    "same tokens as a worker without openings; one without it gets the "
    "header as the environment's") {
  RewardingEnvironment service;  // no opening observations
  service.reward = 1.0;
  LoopbackServer server(&service);
  const std::vector<int32_t> ready = {3, 4, 5, kHeader[0], kHeader[1]};
  EpisodeResult before, after, bare;
  {
    Rig rig(server.address(), EpisodeLimits{});
    rig.script = {"7"};
    REQUIRE(rig.Start("plain", 3, {}, ready).ok());
    before = rig.RunOne();
  }
  {
    Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
    rig.script = {"7", "7"};
    REQUIRE(rig.Start("plain", 3, {}, ready).ok());
    after = rig.RunOne();
    REQUIRE(rig.Start("headless", 3, {}, {3, 4, 5}).ok());
    bare = rig.RunOne();
  }
  CHECK(before.end_reason == "environment");
  CHECK(after.end_reason == "environment");
  CHECK(after.sample.output == before.sample.output);
  CHECK(after.sample.logprobs == before.sample.logprobs);
  CHECK(after.sample.source_spans.empty());
  CHECK(bare.end_reason == "environment");
  CheckOpening(bare, kHeader);
}

TEST_CASE(
    "an opening too large for max_episode_tokens ends observation_too_large "
    "at the first turn, which did not see it; a failed open ends "
    "environment_failed") {
  RewardingEnvironment service;
  service.opening_observation = true;  // 18 bytes: 1 + 18 + 2 tokens
  service.reward = 1.0;
  LoopbackServer server(&service);
  EpisodeLimits limits;
  limits.max_episode_tokens = 21;
  {
    Rig rig(server.address(), limits, {}, {}, /*openings=*/true);
    rig.script = {"7"};
    REQUIRE(rig.Start("vast", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "observation_too_large");
    CHECK_THAT(r.end_text, Catch::Contains("21 tokens (with the generation "
                                           "header), which leave no room in "
                                           "max_episode_tokens 21"));
    // Not the observation: the generation header alone, then one turn
    // (a completion is never empty), and no step was sent.
    CheckOpening(r, kHeader);
    CHECK(r.sample.turns == 1);
    CHECK(rig.decoded.empty());
    CHECK_FALSE(r.reward.has_value());
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (service.closed < 1 && absl::Now() < give_up) {
      rig.driver.Poll();
      absl::SleepFor(absl::Milliseconds(10));
    }
    CHECK(service.closed == 1);
  }
  {
    // One token more leaves room for a one-token turn.
    limits.max_episode_tokens = 22;
    Rig rig(server.address(), limits, {}, {}, /*openings=*/true);
    rig.script = {"7"};
    REQUIRE(rig.Start("snug", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment");
    CheckOpening(r, OpeningFor("You are in a maze."));
    CHECK(r.sample.output.size() == 22);
  }
  {
    EnvironmentClientOptions options;
    options.open_timeout = absl::Milliseconds(300);
    Rig rig("127.0.0.1:1", EpisodeLimits{}, options, {}, /*openings=*/true);
    REQUIRE(rig.Start("nobody", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment_failed");
    CHECK_THAT(r.end_text, Catch::Contains("OpenEpisode"));
    CheckOpening(r, kHeader);
    CHECK(rig.decoded.empty());
  }
}

TEST_CASE(
    "opening observations after a prompt that ends with the generation "
    "header are refused, naming the fix") {
  RewardingEnvironment service;
  service.opening_observation = true;
  service.reward = 1.0;
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
  rig.script = {"7"};
  REQUIRE(rig.Start("late", 3, {}, {3, 4, 5, kHeader[0], kHeader[1]}).ok());
  EpisodeResult r = rig.RunOne();
  CHECK(r.end_reason == "environment_failed");
  CHECK_THAT(r.end_text,
             Catch::Contains("write the prompts of this environment without "
                             "the generation header"));
  CHECK_FALSE(r.reward.has_value());
}

TEST_CASE(
    "AbortUnstarted gives back a task still waiting for its opens and "
    "closes its episodes") {
  HangingEnvironment service;  // opens as "hang-1", counts its closes
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
  REQUIRE(rig.Start("waiting", 3, {}, {3, 4, 5}, /*n=*/2).ok());
  // The open replies are taken only by Poll: the task has not started.
  CHECK(rig.driver.active() == 2);
  CHECK(rig.engine.idle());
  CHECK(rig.driver.AbortUnstarted() == std::vector<std::string>{"waiting"});
  CHECK(rig.driver.active() == 0);
  CHECK(rig.driver.AbortUnstarted().empty());
  // Both opens answer later; their episodes are closed then.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (service.closes < 2 && absl::Now() < give_up) {
    rig.driver.Poll();
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(service.closes == 2);
  CHECK(rig.engine.idle());
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
