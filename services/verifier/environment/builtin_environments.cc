#include "services/verifier/environment/builtin_environments.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/environment/calculator.h"
#include "nlohmann/json.hpp"

namespace tandem::verifier {

StepResult ScoreAnswer(const EpisodeTask& task, const std::string& text) {
  ScoreRequest request;
  request.completion_text = text;
  request.prompt_text = task.prompt_text;
  request.metadata = task.metadata;
  request.deadline = std::min(task.deadline, absl::Now() + task.score_timeout);
  request.cancelled = task.cancelled;
  ScoreResult score = task.scorer->Score(request);
  StepResult result;
  result.done = true;
  result.outcome = score.outcome;
  if (score.outcome == kOutcomeError ||
      score.outcome == kOutcomeSandboxUnavailable) {
    result.end_reason = tandem::v1::EPISODE_END_ERROR;
    result.end_text = absl::StrCat("the scorer failed: ", score.reason);
    return result;
  }
  result.reward = score.reward;
  result.end_reason = tandem::v1::EPISODE_END_ANSWERED;
  result.end_text = score.reason;
  return result;
}

namespace {

using environment::CalculatorOutcome;
using environment::kCalculatorTool;

class CalculatorEnvironment : public BuiltinEnvironment {
 public:
  std::string name() const override { return "calculator"; }
  std::string description() const override {
    return "Arithmetic with a calculator tool (+ - * / ** and parentheses "
           "on integers and decimals); a turn without a tool call is the "
           "answer, scored by the task's verifier.";
  }
  std::string tools_json() const override {
    return nlohmann::json::array(
               {{{"type", "function"},
                 {"function",
                  {{"name", kCalculatorTool},
                   {"description",
                    "Evaluates an arithmetic expression with + - * / ** "
                    "and parentheses, e.g. \"(12 + 3) * 4 / 5\"."},
                   {"parameters",
                    {{"type", "object"},
                     {"properties",
                      {{"expression",
                        {{"type", "string"},
                         {"description", "The expression to evaluate."}}}}},
                     {"required", {"expression"}}}}}}}})
        .dump();
  }

  StepResult Step(const EpisodeTask& task, const tandem::v1::Action& action,
                  EnvironmentMetrics& metrics) override {
    if (action.tool_calls().empty()) return ScoreAnswer(task, action.text());
    StepResult result;
    for (const tandem::v1::ToolCall& call : action.tool_calls()) {
      tandem::v1::Observation& obs = result.observations.emplace_back();
      obs.set_role("tool");
      obs.set_tool_call_id(call.id());
      obs.set_name(call.name());
      if (call.name() != kCalculatorTool) {
        metrics.CountToolCall("unknown", kToolUnknown);
        obs.set_content(absl::StrCat("error: unknown tool '",
                                     call.name().substr(0, 64),
                                     "'; the only tool is calculator"));
        continue;
      }
      environment::CalculatorReply reply =
          environment::RunCalculatorCall(call.arguments_json());
      metrics.CountToolCall(kCalculatorTool,
                            reply.outcome == CalculatorOutcome::kOk ? kToolOk
                            : reply.outcome == CalculatorOutcome::kError
                                ? kToolError
                                : kToolBadArguments);
      obs.set_content(std::move(reply.content));
    }
    return result;
  }
};

class SingleTurnEnvironment : public BuiltinEnvironment {
 public:
  std::string name() const override { return "single_turn"; }
  std::string description() const override {
    return "One turn: the model's answer is scored by the task's verifier "
           "(any existing task as an episode).";
  }
  std::string tools_json() const override { return "[]"; }
  StepResult Step(const EpisodeTask& task, const tandem::v1::Action& action,
                  EnvironmentMetrics& metrics) override {
    return ScoreAnswer(task, action.text());
  }
};

}  // namespace

std::unique_ptr<BuiltinEnvironment> MakeCalculatorEnvironment() {
  return std::make_unique<CalculatorEnvironment>();
}

std::unique_ptr<BuiltinEnvironment> MakeSingleTurnEnvironment() {
  return std::make_unique<SingleTurnEnvironment>();
}

}  // namespace tandem::verifier
