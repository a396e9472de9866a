#pragma once

// The built-in multi-turn "tools" task: products of two many-digit numbers,
// which the tiny built-in model cannot compute in its head but can get
// right by calling the `calculator` environment's tool and copying its
// result (docs/environments.md, "The tools demo task").
//
// One problem is one episode of three messages after the user's question:
//   user       "4821*7312"
//   assistant  <tool_call>{"name": "calculator", "arguments":
//              {"expression": "4821*7312"}}</tool_call>          (model)
//   tool       "35251152"                              (environment, masked)
//   assistant  "35251152"                                          (model)
// The reward is 1 iff the final answer turn is exactly the product's
// digits (ScoreToolsAnswer; the verifier daemon's `exact` scorer with
// metadata.answer gives the same verdict on the turn text that the
// calculator environment passes it).
//
// The split depends only on the problem (a hash of its expression with a
// salt of its own, different from the arithmetic task's), never on the
// seed, so train and held-out problems are disjoint across seeds and runs.
// Streams are pure functions of (options, split, index), as ArithTask's.
//
// Thread safety: immutable after construction; all methods are const.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/task/task_split.h"

namespace tandem::task {

struct ToolsTaskOptions {
  // Digits of each operand, in [2, 9] (the product fits in int64, and the
  // calculator's int64 arithmetic is exact). Operands are uniform in
  // [10^(digits-1), 10^digits): exactly `digits` digits, no leading zeros.
  int digits = 4;
  // Percent of all problems that belong to the held-out split, in [1, 99].
  int heldout_percent = 10;
  // Seed of the problem streams.
  uint64_t seed = 0;
};

struct ToolsProblem {
  int64_t a = 0;
  int64_t b = 0;
  // "a*b", e.g. "4821*7312": the user's message and the tool's argument.
  std::string expression;
  // The product's digits, e.g. "35251152".
  std::string answer;
  // Stable id naming the problem, e.g. "tools-4821*7312".
  std::string id;
};

class ToolsTask {
 public:
  // Checks the option ranges; errors name the field and value.
  static absl::StatusOr<ToolsTask> Create(const ToolsTaskOptions& options);

  // The problem a*b (no range check on the operands beyond a, b >= 0).
  static ToolsProblem MakeProblem(int64_t a, int64_t b);

  Split SplitOf(const ToolsProblem& problem) const;

  // Problem number `index` of the seeded stream of `split`.
  ToolsProblem Sample(Split split, uint64_t index) const;

  // The first `count` problems of the stream of `split`.
  std::vector<ToolsProblem> Take(Split split, uint64_t count) const;

  const ToolsTaskOptions& options() const { return options_; }

 private:
  explicit ToolsTask(const ToolsTaskOptions& options) : options_(options) {}
  ToolsTaskOptions options_;
  int64_t operand_low_ = 0;   // 10^(digits-1)
  int64_t operand_high_ = 0;  // 10^digits
};

// The model's first turn of the demonstration: one Hermes-style call,
// `<tool_call>{"name": "calculator", "arguments": {"expression":
// "a*b"}}</tool_call>` (JSON as the task's chat template renders an assistant's
// tool_calls; common/chat/tool_calls.h parses it, format `demo`).
std::string ToolsCallTurn(const ToolsProblem& problem);

// Exact match of a final answer turn: the turn's text with trailing
// end-of-turn markers (<|im_end|>, <|endoftext|>) and then ASCII whitespace
// removed at both ends must equal problem.answer byte for byte (no sign,
// no leading zeros, no separators). A turn that still holds a tool call is
// not an answer.
bool ScoreToolsAnswer(const ToolsProblem& problem, absl::string_view turn);

// Parses "a*b" (each operand 1 to 9 ASCII digits) back into a problem;
// errors say what is wrong. Used to check datasets and by tests.
absl::StatusOr<ToolsProblem> ParseToolsExpression(absl::string_view text);

}  // namespace tandem::task
