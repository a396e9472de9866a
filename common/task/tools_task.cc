#include "common/task/tools_task.h"

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tandem::task {
namespace {

// splitmix64, as the arithmetic task's streams: portable, so streams and
// splits are the same on every platform and standard library.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over the expression, mixed with this task's own salt.
uint64_t HashText(absl::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix(h ^ 0x7461736b2d746f6fULL /* "task-too" */);
}

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
  const uint64_t bucket = HashText(problem.expression) % 100;
  return bucket < static_cast<uint64_t>(options_.heldout_percent)
             ? Split::kHeldOut
             : Split::kTrain;
}

ToolsProblem ToolsTask::Sample(Split split, uint64_t index) const {
  // One generator state per index (Sample(i) does not depend on the
  // problems before it); rejection sampling keeps the problem's split.
  uint64_t state =
      Mix(options_.seed ^ Mix(index * 2 + (split == Split::kHeldOut ? 1 : 0)));
  const uint64_t span = static_cast<uint64_t>(operand_high_ - operand_low_);
  while (true) {
    state = Mix(state);
    const int64_t a = operand_low_ + static_cast<int64_t>(state % span);
    state = Mix(state);
    const int64_t b = operand_low_ + static_cast<int64_t>(state % span);
    ToolsProblem problem = MakeProblem(a, b);
    if (SplitOf(problem) == split) return problem;
  }
}

std::vector<ToolsProblem> ToolsTask::Take(Split split, uint64_t count) const {
  std::vector<ToolsProblem> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(Sample(split, i));
  return out;
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
