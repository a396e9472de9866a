// The rollout worker's non-blocking Environment client
// (services/rollout/environment_client.h): a calculator episode against
// the real verifier daemon in process (open, a tool call and its
// observation, the scored answer, close, an unknown episode); an
// environment that never answers ends the call with DEADLINE_EXCEEDED at
// the step deadline; Stop() cancels a call in flight and returns at once;
// an address nobody serves is UNAVAILABLE; calls never block the caller.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "services/rollout/environment_client.h"
#include "services/verifier/verifier.h"

namespace tandem::rollout {
namespace {

std::unique_ptr<verifier::Verifier> StartVerifier() {
  verifier::VerifierConfig config;
  config.server.metrics_address = "";
  // Nobody listens there: registration retries in the background.
  config.coordinator_address = "127.0.0.1:1";
  config.worker_threads = 2;
  auto created = verifier::Verifier::Create(config);
  REQUIRE(created.ok());
  REQUIRE((*created)->Start().ok());
  return *std::move(created);
}

EnvironmentReply WaitOne(EnvironmentClient* client, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    if (client->WaitForReply(absl::Milliseconds(50))) {
      std::vector<EnvironmentReply> replies = client->TakeCompleted();
      REQUIRE(replies.size() == 1);
      return replies[0];
    }
  }
  FAIL("no reply within " << absl::FormatDuration(timeout));
  return {};
}

TEST_CASE("a calculator episode against the real verifier, call by call") {
  std::unique_ptr<verifier::Verifier> daemon = StartVerifier();
  const std::string address = daemon->grpc_address();
  EnvironmentClient client(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), address,
      {});
  tandem::v1::OpenEpisodeRequest open;
  open.set_environment("calculator");
  open.set_task_id("t1");
  open.set_prompt_text("What is 317*29?");
  open.set_verifier("exact");
  (*open.mutable_metadata())["answer"] = "9193";
  client.Open("lease-1/0", open);
  EnvironmentReply opened = WaitOne(&client, absl::Seconds(20));
  INFO(opened.status.ToString());
  REQUIRE(opened.status.ok());
  CHECK(opened.kind == EnvironmentReply::Kind::kOpen);
  CHECK(opened.key == "lease-1/0");
  CHECK(opened.open.tools_json().find("calculator") != std::string::npos);
  const std::string episode = opened.open.episode_id();
  REQUIRE_FALSE(episode.empty());

  tandem::v1::StepRequest step;
  step.set_episode_id(episode);
  tandem::v1::ToolCall* call = step.mutable_action()->add_tool_calls();
  call->set_id("call_0");
  call->set_name("calculator");
  call->set_arguments_json(R"({"expression":"317*29"})");
  client.Step("lease-1/0", step);
  EnvironmentReply observed = WaitOne(&client, absl::Seconds(20));
  REQUIRE(observed.status.ok());
  CHECK_FALSE(observed.step.done());
  REQUIRE(observed.step.observations_size() == 1);
  CHECK(observed.step.observations(0).role() == "tool");
  CHECK(observed.step.observations(0).tool_call_id() == "call_0");
  CHECK(observed.step.observations(0).content() == "9193");

  tandem::v1::StepRequest answer;
  answer.set_episode_id(episode);
  answer.mutable_action()->set_text("9193");
  client.Step("lease-1/0", answer);
  EnvironmentReply scored = WaitOne(&client, absl::Seconds(20));
  REQUIRE(scored.status.ok());
  CHECK(scored.step.done());
  REQUIRE(scored.step.has_reward());
  CHECK(scored.step.reward() == 1.0);
  CHECK(scored.step.end_reason() == tandem::v1::EPISODE_END_ANSWERED);

  client.Close("lease-1/0", episode);
  EnvironmentReply closed = WaitOne(&client, absl::Seconds(20));
  REQUIRE(closed.status.ok());
  CHECK(closed.kind == EnvironmentReply::Kind::kClose);

  tandem::v1::StepRequest lost;
  lost.set_episode_id("no-such-episode");
  lost.mutable_action()->set_text("1");
  client.Step("lease-2/0", lost);
  EnvironmentReply not_found = WaitOne(&client, absl::Seconds(20));
  CHECK(not_found.status.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(not_found.status.message()),
             Catch::Contains("Step of episode no-such-episode at " + address));
  client.Stop();
  daemon->GracefulStop(absl::Seconds(10));
}

// An environment whose Step never answers (until the call is cancelled).
class HangingEnvironment : public tandem::v1::Environment::CallbackService {
 public:
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext*,
                                 const tandem::v1::StepRequest*,
                                 tandem::v1::StepResponse*) override {
    ++steps;
    class Hanging : public grpc::ServerUnaryReactor {
     public:
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }
    };
    return new Hanging;
  }
  std::atomic<int> steps{0};  // Step calls that reached the server
};

struct HangingServer {
  HangingEnvironment service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  HangingServer() {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~HangingServer() {
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  }
};

TEST_CASE(
    "an environment that hangs: the Step ends at its deadline, and the "
    "call never blocks the caller") {
  HangingServer hanging;
  EnvironmentClientOptions options;
  options.step_timeout = absl::Milliseconds(300);
  EnvironmentClient client(
      grpc::CreateChannel(hanging.address, grpc::InsecureChannelCredentials()),
      hanging.address, options);
  tandem::v1::StepRequest step;
  step.set_episode_id("e-1");
  const absl::Time start = absl::Now();
  client.Step("k", step);
  CHECK(absl::Now() - start < absl::Milliseconds(100));
  CHECK(client.in_flight() == 1);
  EnvironmentReply reply = WaitOne(&client, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  CHECK(reply.status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(reply.status.message()),
             Catch::Contains("Step of episode e-1 at " + hanging.address));
  CHECK_THAT(std::string(reply.status.message()),
             Catch::Contains("no answer after"));
  CHECK(took >= absl::Milliseconds(250));
  CHECK(took < absl::Seconds(5));
  CHECK(client.in_flight() == 0);
}

TEST_CASE("Stop cancels a call in flight at once; later calls are refused") {
  HangingServer hanging;
  EnvironmentClientOptions options;
  options.step_timeout = absl::Seconds(60);
  EnvironmentClient client(
      grpc::CreateChannel(hanging.address, grpc::InsecureChannelCredentials()),
      hanging.address, options);
  tandem::v1::StepRequest step;
  step.set_episode_id("e-2");
  client.Step("k", step);
  // Stopped once the call is in flight at the server (real I/O).
  const absl::Time arrive_by = absl::Now() + absl::Seconds(10);
  while (hanging.service.steps.load() < 1 && absl::Now() < arrive_by) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  REQUIRE(hanging.service.steps.load() == 1);
  const absl::Time start = absl::Now();
  client.Stop();
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(client.in_flight() == 0);
  std::vector<EnvironmentReply> replies = client.TakeCompleted();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].status.code() == absl::StatusCode::kCancelled);
  client.Step("k2", step);
  replies = client.TakeCompleted();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].status.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(replies[0].status.message()),
             Catch::Contains("the environment client is stopped"));
}

TEST_CASE("an address nobody serves is UNAVAILABLE, named in the error") {
  EnvironmentClientOptions options;
  options.open_timeout = absl::Seconds(5);
  EnvironmentClient client(
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()),
      "127.0.0.1:1", options);
  tandem::v1::OpenEpisodeRequest open;
  open.set_environment("calculator");
  client.Open("k", open);
  EnvironmentReply reply = WaitOne(&client, absl::Seconds(10));
  CHECK(reply.status.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(reply.status.message()),
             Catch::Contains("OpenEpisode of environment \"calculator\" at "
                             "127.0.0.1:1"));
}

}  // namespace
}  // namespace tandem::rollout
