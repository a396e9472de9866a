#include "common/task/tools_task.h"

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tandem::task {
namespace {

// This task's own salt for the split hash.
constexpr uint64_t kSplitSalt = 0x7461736b2d746f6fULL;  // "task-too"

constexpr std::array<absl::string_view, 2> kTurnEndMarkers = {"<|im_end|>",
                                                              "<|endoftext|>"};

bool ParseOperand(absl::string_view text, int64_t* value) {
  if (text.empty() || text.size() > 9) return false;
  int64_t v = 0;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

}  // namespace

absl::StatusOr<ToolsTask> ToolsTask::Create(const ToolsTaskOptions& options) {
  if (options.digits < 2 || options.digits > 9) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tools task: digits must be in [2, 9], got ", options.digits));
  }
  if (options.heldout_percent < 1 || options.heldout_percent > 99) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools task: heldout_percent must be in [1, 99], got ",
                     options.heldout_percent));
  }
  ToolsTask task(options);
  task.operand_low_ = 1;
  for (int i = 1; i < options.digits; ++i) task.operand_low_ *= 10;
  task.operand_high_ = task.operand_low_ * 10;
  return task;
}

ToolsProblem ToolsTask::MakeProblem(int64_t a, int64_t b) {
  ToolsProblem p;
  p.a = a;
  p.b = b;
  p.expression = absl::StrCat(a, "*", b);
  p.answer = absl::StrCat(a * b);
  p.id = absl::StrCat("tools-", p.expression);
  return p;
}

Split ToolsTask::SplitOf(const ToolsProblem& problem) const {
  return SplitOfText(problem.expression, kSplitSalt, options_.heldout_percent);
}

ToolsProblem ToolsTask::Sample(Split split, uint64_t index) const {
  const uint64_t span = static_cast<uint64_t>(operand_high_ - operand_low_);
  return SampleInSplit(*this, options_.seed, split, index,
                       [&](SplitStream& stream) {
                         const int64_t a = operand_low_ + static_cast<int64_t>(
                                                              stream.Next() % span);
                         const int64_t b = operand_low_ + static_cast<int64_t>(
                                                              stream.Next() % span);
                         return MakeProblem(a, b);
                       });
}

std::vector<ToolsProblem> ToolsTask::Take(Split split, uint64_t count) const {
  return TakeFromSplit(*this, split, count);
}

std::string ToolsCallTurn(const ToolsProblem& problem) {
  return absl::StrCat(
      "<tool_call>{\"name\": \"calculator\", \"arguments\": "
      "{\"expression\": \"",
      problem.expression, "\"}}</tool_call>");
}

bool ScoreToolsAnswer(const ToolsProblem& problem, absl::string_view turn) {
  absl::string_view text = absl::StripAsciiWhitespace(turn);
  bool stripped = true;
  while (stripped) {
    stripped = false;
    for (absl::string_view marker : kTurnEndMarkers) {
      if (absl::ConsumeSuffix(&text, marker)) {
        text = absl::StripAsciiWhitespace(text);
        stripped = true;
      }
    }
  }
  if (absl::StrContains(text, "<tool_call>")) return false;
  return !problem.answer.empty() && text == problem.answer;
}

absl::StatusOr<ToolsProblem> ParseToolsExpression(absl::string_view text) {
  const size_t star = text.find('*');
  if (star == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools expression has no '*' operator: \"", text, "\""));
  }
  int64_t a = 0;
  int64_t b = 0;
  if (!ParseOperand(text.substr(0, star), &a) ||
      !ParseOperand(text.substr(star + 1), &b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tools expression operands must be 1 to 9 digits: \"", text, "\""));
  }
  return ToolsTask::MakeProblem(a, b);
}

}  // namespace tandem::task
