#include "common/task/tools_task.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "common/chat/tool_calls.h"

namespace tandem::task {
namespace {

ToolsTask MakeTask(ToolsTaskOptions options = {}) {
  auto task = ToolsTask::Create(options);
  REQUIRE(task.ok());
  return *task;
}

TEST_CASE("Tools problems are a product a*b answered by its digits",
          "[task][tools]") {
  ToolsProblem p = ToolsTask::MakeProblem(4821, 7312);
  CHECK(p.expression == "4821*7312");
  CHECK(p.answer == "35251152");
  CHECK(p.id == "tools-4821*7312");
  // The largest 9-digit product still fits in int64.
  CHECK(ToolsTask::MakeProblem(999999999, 999999999).answer ==
        "999999998000000001");
}

TEST_CASE("Tools task options out of range are refused, naming the field",
          "[task][tools]") {
  ToolsTaskOptions o;
  o.digits = 1;
  auto one = ToolsTask::Create(o);
  REQUIRE_FALSE(one.ok());
  CHECK(std::string(one.status().message()) ==
        "tools task: digits must be in [2, 9], got 1");
  o.digits = 10;
  CHECK_FALSE(ToolsTask::Create(o).ok());
  o.digits = 4;
  o.heldout_percent = 0;
  auto none = ToolsTask::Create(o);
  REQUIRE_FALSE(none.ok());
  CHECK(std::string(none.status().message()) ==
        "tools task: heldout_percent must be in [1, 99], got 0");
}

TEST_CASE("Tools operands have exactly `digits` digits and streams are seeded",
          "[task][tools]") {
  ToolsTaskOptions o;
  o.digits = 5;
  const ToolsTask task = MakeTask(o);
  for (const ToolsProblem& p : task.Take(Split::kTrain, 500)) {
    CHECK(p.a >= 10000);
    CHECK(p.a <= 99999);
    CHECK(p.b >= 10000);
    CHECK(p.b <= 99999);
  }
  // Same options and index: same problem, whatever was drawn before.
  CHECK(task.Sample(Split::kTrain, 37).id ==
        MakeTask(o).Take(Split::kTrain, 38).back().id);
  o.seed = 1;
  const ToolsTask other = MakeTask(o);
  int same = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    same +=
        task.Sample(Split::kTrain, i).id == other.Sample(Split::kTrain, i).id;
  }
  CHECK(same < 5);
}

TEST_CASE("Tools train and held-out problems are disjoint across seeds",
          "[task][tools]") {
  std::set<std::string> heldout;
  std::set<std::string> train;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    ToolsTaskOptions o;
    o.digits = 2;  // a small space, so that streams do collide
    o.seed = seed;
    const ToolsTask task = MakeTask(o);
    for (const ToolsProblem& p : task.Take(Split::kHeldOut, 300)) {
      CHECK(task.SplitOf(p) == Split::kHeldOut);
      heldout.insert(p.id);
    }
    for (const ToolsProblem& p : task.Take(Split::kTrain, 300)) {
      CHECK(task.SplitOf(p) == Split::kTrain);
      train.insert(p.id);
    }
  }
  for (const std::string& id : heldout) CHECK(train.count(id) == 0);
  // About 10% of 8100 two-digit products are held out.
  CHECK(heldout.size() > 300);
  CHECK(heldout.size() < 1300);
}

TEST_CASE("The demonstration's call turn parses as one calculator call",
          "[task][tools]") {
  const ToolsProblem p = ToolsTask::MakeProblem(4821, 7312);
  const std::string turn = ToolsCallTurn(p) + "<|im_end|>";
  auto parsed = chat::ParseToolCalls(turn, chat::ToolCallFormat::kHermes);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->calls.size() == 1);
  CHECK(parsed->calls[0].name == "calculator");
  CHECK(parsed->calls[0].arguments_json == "{\"expression\":\"4821*7312\"}");
  CHECK(parsed->content.empty());
}

TEST_CASE("A tools answer scores only as the exact product digits",
          "[task][tools]") {
  const ToolsProblem p = ToolsTask::MakeProblem(4821, 7312);
  CHECK(ScoreToolsAnswer(p, "35251152"));
  CHECK(ScoreToolsAnswer(p, "35251152<|im_end|>"));
  CHECK(ScoreToolsAnswer(p, " 35251152 <|im_end|>\n<|endoftext|>"));
  CHECK_FALSE(ScoreToolsAnswer(p, "35251153"));
  CHECK_FALSE(ScoreToolsAnswer(p, "035251152"));
  CHECK_FALSE(ScoreToolsAnswer(p, "35,251,152"));
  CHECK_FALSE(ScoreToolsAnswer(p, "35251152 35251152"));
  CHECK_FALSE(ScoreToolsAnswer(p, "3525115"));
  CHECK_FALSE(ScoreToolsAnswer(p, ""));
  CHECK_FALSE(ScoreToolsAnswer(p, "<|im_end|>"));
  CHECK_FALSE(ScoreToolsAnswer(p, ToolsCallTurn(p)));
  CHECK_FALSE(ScoreToolsAnswer(p, "35251152" + ToolsCallTurn(p)));
}

TEST_CASE("Tools expressions parse back into their problem", "[task][tools]") {
  auto p = ParseToolsExpression("4821*7312");
  REQUIRE(p.ok());
  CHECK(p->id == "tools-4821*7312");
  CHECK(p->answer == "35251152");
  auto bad = ParseToolsExpression("4821+7312");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "tools expression has no '*' operator: \"4821+7312\"");
  CHECK_FALSE(ParseToolsExpression("*12").ok());
  CHECK_FALSE(ParseToolsExpression("12*1234567890").ok());
  CHECK_FALSE(ParseToolsExpression("12*3a").ok());
}

}  // namespace
}  // namespace tandem::task
