#pragma once

// The rig of the EpisodeDriver tests (rollout_episode_driver_test,
// rollout_episode_opening_test): the engine over the deterministic toy
// model, a driver with a scripted codec, the real verifier daemon in
// process, and the tests' own Environment services on loopback.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/rollout/episode_driver.h"
#include "services/verifier/verifier.h"
#include "tests/unit/toy_engine_model.h"

namespace tandem::rollout::test {

inline constexpr int32_t kVocab = 64;
// The end-of-turn tokens a turn ended by a stop string is closed with.
inline const std::vector<int32_t> kTurnEnd = {62, 63};

inline std::unique_ptr<verifier::Verifier> StartVerifier() {
  verifier::VerifierConfig config;
  config.server.metrics_address = "";
  config.coordinator_address = "127.0.0.1:1";  // nobody: retried in background
  config.worker_threads = 2;
  auto created = verifier::Verifier::Create(config);
  REQUIRE(created.ok());
  REQUIRE((*created)->Start().ok());
  return *std::move(created);
}

inline std::vector<int32_t> Render(
    const std::vector<tandem::v1::Observation>& obs) {
  std::vector<int32_t> tokens;
  for (const auto& o : obs) {
    tokens.push_back(1);  // a stand-in for the tool message header
    for (unsigned char c : o.content()) tokens.push_back(2 + c % (kVocab - 2));
  }
  return tokens;
}

// The stand-in chat template's generation header, and its rendering of
// opening observations (each as Render, then the header).
inline const std::vector<int32_t> kHeader = {60, 61};
inline std::vector<int32_t> RenderOpening(
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
        [this,
         letters = !turn_stops.empty()](const std::vector<int32_t>& tokens) {
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
      codec.render_opening = [](const std::vector<tandem::v1::Observation>& obs)
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

// Ends every episode at its first Step with `reward` and no end reason.
class RewardingEnvironment : public tandem::v1::Environment::CallbackService {
 public:
  grpc::ServerUnaryReactor* OpenEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::OpenEpisodeRequest*,
      tandem::v1::OpenEpisodeResponse* response) override {
    // One read of the counter: two opens served at once each get their own
    // number (a second load could see the other's increment).
    const int number = ++opened;
    response->set_episode_id(absl::StrCat("r-", number));
    if (opening_observation) {
      tandem::v1::Observation* o = response->add_observations();
      o->set_role("user");
      // numbered_opening: each episode its own room (a randomised reset).
      o->set_content(numbered_opening
                         ? absl::StrCat("You are in room ", number)
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

}  // namespace tandem::rollout::test
