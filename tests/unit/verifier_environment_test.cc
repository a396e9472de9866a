// The calculator tool's evaluator (exact integers, decimals, precedence,
// errors for the model, the bounds) and the episode table's limits
// (max_turns, max_observation_bytes, episode_timeout_ms, max_open_episodes,
// idle reaping, action size, unknown ids and environments), with the real
// exact scorer.

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/environment/calculator.h"
#include "prometheus/registry.h"
#include "services/verifier/environment/environment_request_limits.h"
#include "services/verifier/environment/episode_table.h"
#include "services/verifier/scoring/scorer_registry.h"
#include "tests/support/fake_clock.h"

namespace tandem::verifier {
namespace {

using environment::CalculatorOutcome;
using environment::EvaluateCalculator;
using environment::RunCalculatorCall;

std::string Eval(const std::string& expression) {
  absl::StatusOr<std::string> value = EvaluateCalculator(expression);
  return value.ok() ? *value : "ERR " + std::string(value.status().message());
}

TEST_CASE("calculator evaluates integer and decimal arithmetic") {
  CHECK(Eval("1 + 2 * 3") == "7");
  CHECK(Eval("(1 + 2) * 3") == "9");
  CHECK(Eval("2 ** 10") == "1024");
  CHECK(Eval("2 ** 3 ** 2") == "512");  // Right-associative.
  CHECK(Eval("-2 ** 2") == "-4");
  CHECK(Eval("7 / 2") == "3.5");
  CHECK(Eval("8 / 2") == "4");
  CHECK(Eval("0.1 + 0.2") == "0.3");
  CHECK(Eval("  -(3 - 10) ") == "7");
  CHECK(Eval("9223372036854775807 + 1") == "9.22337203685478e+18");
  CHECK(Eval("2 ** -1") == "0.5");
  CHECK(Eval("1.5 * 4") == "6");
}

TEST_CASE("calculator errors say what was wrong") {
  CHECK(absl::StartsWith(Eval("1 / 0"), "ERR division by zero"));
  CHECK(absl::StartsWith(Eval("1 +"), "ERR expected a number"));
  CHECK(absl::StartsWith(Eval("(1 + 2"), "ERR missing ')'"));
  CHECK(absl::StartsWith(Eval("2 $ 3"), "ERR unexpected '$'"));
  CHECK(absl::StartsWith(Eval("__import__('os')"), "ERR expected a number"));
  CHECK(absl::StartsWith(Eval("(-8) ** 0.5"), "ERR a negative number"));
}

TEST_CASE("calculator calls: arguments checked, replies as the model sees them") {
  // The tools demo task's products (tandem-local --task tools).
  environment::CalculatorReply ok =
      RunCalculatorCall("{\"expression\": \"4821*7312\"}");
  CHECK(ok.outcome == CalculatorOutcome::kOk);
  CHECK(ok.content == "35251152");
  CHECK(RunCalculatorCall("{\"expression\": \"(4821) * 7312\"}").content ==
        "35251152");
  environment::CalculatorReply err =
      RunCalculatorCall("{\"expression\": \"1 / 0\"}");
  CHECK(err.outcome == CalculatorOutcome::kError);
  CHECK(absl::StartsWith(err.content, "error: division by zero"));
  for (const char* bad : {"not json", "[1]", "{\"x\": \"1*2\"}",
                          "{\"expression\": 12}"}) {
    environment::CalculatorReply reply = RunCalculatorCall(bad);
    CAPTURE(bad);
    CHECK(reply.outcome == CalculatorOutcome::kBadArguments);
    CHECK(absl::StartsWith(reply.content, "error: "));
  }
}

TEST_CASE("calculator bounds: length, depth, exponent, overflow") {
  CHECK(absl::StrContains(Eval(std::string(300, '1')), "longer than 256"));
  CHECK(
      absl::StrContains(Eval(std::string(40, '(') + "1" + std::string(40, ')')),
                        "nesting deeper than 32"));
  CHECK(absl::StrContains(Eval(std::string(100, '-') + "1"),
                          "nesting deeper than 32"));
  CHECK(absl::StrContains(Eval("2 ** 100000"), "larger than 1024"));
  CHECK(Eval("10 ** 300 * 10 ** 300") ==
        "ERR the result is not a finite number");
}

struct Fixture {
  explicit Fixture(EnvironmentConfig config) : metrics(registry) {
    ScorerRegistry scorer_registry;
    REQUIRE(
        RegisterBuiltinScorers(BuiltinScorerConfig{}, &scorer_registry).ok());
    scorers["exact"] = *scorer_registry.Create("exact");
    table = std::make_unique<EpisodeTable>(config, &scorers, &metrics,
                                           absl::InfiniteDuration(), &clock);
  }
  std::string Open(const std::string& env = "calculator",
                   const std::string& owner = "") {
    tandem::v1::OpenEpisodeRequest request;
    request.set_environment(env);
    request.set_task_id("t1");
    request.set_prompt_text("What is 6 * 7?");
    request.set_verifier("exact");
    (*request.mutable_metadata())["answer"] = "42";
    absl::StatusOr<tandem::v1::OpenEpisodeResponse> r =
        table->Open(request, owner);
    REQUIRE(r.ok());
    return r->episode_id();
  }
  absl::StatusOr<tandem::v1::StepResponse> Call(
      const std::string& id, const std::string& args,
      const std::string& tool = "calculator") {
    tandem::v1::StepRequest request;
    request.set_episode_id(id);
    tandem::v1::ToolCall* call = request.mutable_action()->add_tool_calls();
    call->set_id("c1");
    call->set_name(tool);
    call->set_arguments_json(args);
    return table->Step(request);
  }
  absl::StatusOr<tandem::v1::StepResponse> Answer(const std::string& id,
                                                  const std::string& text) {
    tandem::v1::StepRequest request;
    request.set_episode_id(id);
    request.mutable_action()->set_text(text);
    return table->Step(request);
  }
  // Times episode_timeout_ms and idle reaping: tests advance it.
  testing::FakeClock clock;
  prometheus::Registry registry;
  EnvironmentMetrics metrics;
  std::map<std::string, std::unique_ptr<Scorer>> scorers;
  std::unique_ptr<EpisodeTable> table;
};

TEST_CASE("an episode: tool calls, bad arguments as observations, answer") {
  Fixture f(EnvironmentConfig{});
  const std::string id = f.Open();
  auto r = f.Call(id, R"({"expression": "6 * 7"})");
  REQUIRE(r.ok());
  CHECK_FALSE(r->done());
  REQUIRE(r->observations_size() == 1);
  CHECK(r->observations(0).role() == "tool");
  CHECK(r->observations(0).tool_call_id() == "c1");
  CHECK(r->observations(0).content() == "42");
  r = f.Call(id, "not json");
  REQUIRE(r.ok());
  CHECK(absl::StrContains(r->observations(0).content(), "JSON object"));
  r = f.Call(id, R"({"expr": "1"})");
  CHECK(absl::StrContains(r->observations(0).content(), "\"expression\""));
  r = f.Call(id, R"({"expression": "1"})", "shell");
  CHECK(absl::StrContains(r->observations(0).content(), "unknown tool"));
  r = f.Answer(id, "42");
  REQUIRE(r.ok());
  CHECK(r->done());
  CHECK(r->end_reason() == tandem::v1::EPISODE_END_ANSWERED);
  REQUIRE(r->has_reward());
  CHECK(r->turn() == 5);
  // Ended: FAILED_PRECONDITION naming the reason; Close is idempotent.
  r = f.Answer(id, "42");
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(r.status().message(), "answered"));
  CHECK(f.table->Close(id).value_or(false));
  CHECK_FALSE(f.table->Close(id).value_or(true));
  CHECK(f.Answer(id, "42").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("only the opener of an episode steps and closes it") {
  Fixture f(EnvironmentConfig{});
  const std::string owner = "spiffe://tandem/rollout/a";
  const std::string other = "spiffe://tandem/rollout/b";
  const std::string id = f.Open("calculator", owner);
  tandem::v1::StepRequest step;
  step.set_episode_id(id);
  step.mutable_action()->set_text("42");
  for (const std::string& caller : {other, std::string()}) {
    CAPTURE(caller);
    auto stepped = f.table->Step(step, caller);
    REQUIRE(stepped.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(absl::StrContains(stepped.status().message(),
                            "was opened by " + owner));
    auto closed = f.table->Close(id, caller);
    CHECK(closed.status().code() == absl::StatusCode::kPermissionDenied);
  }
  // Nothing the others sent counted: the owner's answer is the first turn.
  auto answered = f.table->Step(step, owner);
  REQUIRE(answered.ok());
  CHECK(answered->turn() == 1);
  CHECK(answered->done());
  CHECK(answered->reward() == 1.0);
  auto closed = f.table->Close(id, owner);
  REQUIRE(closed.ok());
  CHECK(*closed);
  CHECK(f.table->size() == 0);
}

TEST_CASE("single_turn scores the first turn") {
  Fixture f(EnvironmentConfig{});
  const std::string id = f.Open("single_turn");
  auto r = f.Answer(id, "41");
  REQUIRE(r.ok());
  CHECK(r->done());
  CHECK(r->reward() == 0.0);
  CHECK(r->outcome() == "incorrect");
}

TEST_CASE("limits end the episode with a reason") {
  EnvironmentConfig config;
  config.max_turns = 2;
  config.max_observation_bytes = 64;
  config.max_open_episodes = 2;
  config.max_action_bytes = 128;
  config.max_tool_calls = 2;
  config.episode_timeout_ms = 100;
  config.idle_timeout_ms = 50;
  Fixture f(config);
  SECTION("max_turns") {
    const std::string id = f.Open();
    CHECK_FALSE(f.Call(id, R"({"expression": "1"})")->done());
    auto r = f.Call(id, R"({"expression": "1"})");
    CHECK(r->done());
    CHECK(r->end_reason() == tandem::v1::EPISODE_END_MAX_TURNS);
    CHECK_FALSE(r->has_reward());
  }
  SECTION("max_observation_bytes") {
    const std::string id = f.Open();
    tandem::v1::StepRequest request;
    request.set_episode_id(id);
    for (int i = 0; i < 2; ++i) {
      tandem::v1::ToolCall* call = request.mutable_action()->add_tool_calls();
      call->set_name("calculator");
      call->set_arguments_json("[1]");  // ~70 bytes of error each.
    }
    auto r = f.table->Step(request);
    REQUIRE(r.ok());
    CHECK(r->end_reason() == tandem::v1::EPISODE_END_OBSERVATION_TOO_LARGE);
    CHECK(r->observations_size() == 0);
  }
  SECTION("action size and tool call count are INVALID_ARGUMENT") {
    const std::string id = f.Open();
    auto r = f.Answer(id, std::string(200, 'x'));
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(r.status().message(), "max_action_bytes"));
    tandem::v1::StepRequest request;
    request.set_episode_id(id);
    for (int i = 0; i < 3; ++i) request.mutable_action()->add_tool_calls();
    r = f.table->Step(request);
    CHECK(absl::StrContains(r.status().message(), "max_tool_calls"));
    CHECK(f.Answer(id, "42")->done());  // The episode is still usable.
  }
  SECTION("episode_timeout_ms") {
    const std::string id = f.Open();
    f.clock.Advance(absl::Milliseconds(120));
    auto r = f.Answer(id, "42");
    REQUIRE(r.ok());
    CHECK(r->end_reason() == tandem::v1::EPISODE_END_TIMEOUT);
  }
  SECTION("max_open_episodes and idle reaping") {
    f.Open();
    const std::string id = f.Open();
    tandem::v1::OpenEpisodeRequest request;
    request.set_environment("calculator");
    request.set_verifier("exact");
    (*request.mutable_metadata())["answer"] = "1";
    auto refused = f.table->Open(request);
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(refused.status().message(), "max_open_episodes"));
    CHECK(f.table->Reap(f.clock.Now()) == 0);
    CHECK(f.table->Reap(f.clock.Now() + absl::Milliseconds(60)) == 2);
    CHECK(f.table->size() == 0);
    CHECK(f.Answer(id, "1").status().code() == absl::StatusCode::kNotFound);
  }
  SECTION("unknown environment, unknown verifier, bad metadata") {
    tandem::v1::OpenEpisodeRequest request;
    request.set_environment("chess");
    request.set_verifier("exact");
    auto r = f.table->Open(request);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(r.status().message(), "calculator, single_turn"));
    request.set_environment("calculator");
    request.set_verifier("nope");
    CHECK(absl::StrContains(f.table->Open(request).status().message(),
                            "unknown verifier"));
    request.set_verifier("exact");
    CHECK(absl::StrContains(f.table->Open(request).status().message(),
                            "metadata.answer"));
    f.table->Cancel();  // Shutting down.
    CHECK(f.table->Open(request).status().code() ==
          absl::StatusCode::kUnavailable);
  }
}

TEST_CASE("every field of every Environment request has a size limit") {
  int methods = 0;
  CHECK(rpc::FieldsWithoutLimits("tandem.v1.Environment",
                                 EnvironmentRequestLimits(), &methods)
            .empty());
  CHECK(methods == 4);
  tandem::v1::StepRequest request;
  request.set_episode_id(std::string(200, 'e'));
  absl::Status status = CheckEnvironmentRequestLimits(request);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(status.message(), "StepRequest.episode_id"));
}

}  // namespace
}  // namespace tandem::verifier
