#include "common/task/arith_task.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace tandem::task {
namespace {

// Keeps the split independent of any other use of the same hash.
constexpr uint64_t kSplitSalt = 0x7461736b2d617269ULL;  // "task-ari"

bool ParseOperand(const std::string& text, int64_t* value) {
  if (text.empty() || text.size() > 18) return false;
  int64_t v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

}  // namespace

absl::StatusOr<ArithTask> ArithTask::Create(const ArithTaskOptions& options) {
  if (options.digits < 1 || options.digits > 18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arith task: digits must be in [1, 18], got ", options.digits));
  }
  if (options.heldout_percent < 1 || options.heldout_percent > 99) {
    return absl::InvalidArgumentError(
        absl::StrCat("arith task: heldout_percent must be in [1, 99], got ",
                     options.heldout_percent));
  }
  ArithTask task(options);
  task.operand_limit_ = 1;
  for (int i = 0; i < options.digits; ++i) task.operand_limit_ *= 10;
  return task;
}

ArithProblem ArithTask::MakeProblem(int64_t a, char op, int64_t b) {
  ArithProblem p;
  p.a = a;
  p.b = b;
  p.op = op;
  p.prompt = absl::StrCat(a, std::string(1, op), b, "=");
  p.answer = absl::StrCat(op == '+' ? a + b : a - b);
  p.id = absl::StrCat("arith-", a, std::string(1, op), b);
  return p;
}

Split ArithTask::SplitOf(const ArithProblem& problem) const {
  return SplitOfText(problem.prompt, kSplitSalt, options_.heldout_percent);
}

ArithProblem ArithTask::Sample(Split split, uint64_t index) const {
  const uint64_t limit = static_cast<uint64_t>(operand_limit_);
  return SampleInSplit(*this, options_.seed, split, index,
                       [&](SplitStream& stream) {
                         const int64_t a =
                             static_cast<int64_t>(stream.Next() % limit);
                         const int64_t b =
                             static_cast<int64_t>(stream.Next() % limit);
                         char op = '+';
                         if (options_.subtraction) {
                           op = (stream.Next() & 1) ? '-' : '+';
                         }
                         return MakeProblem(a, op, b);
                       });
}

std::vector<ArithProblem> ArithTask::Take(Split split, uint64_t count) const {
  return TakeFromSplit(*this, split, count);
}

absl::StatusOr<ArithProblem> ParseArithPrompt(const std::string& prompt) {
  if (prompt.empty() || prompt.back() != '=') {
    return absl::InvalidArgumentError(
        absl::StrCat("arith prompt must end with '=', got \"", prompt, "\""));
  }
  const std::string body = prompt.substr(0, prompt.size() - 1);
  const size_t op_pos = body.find_first_of("+-", 1);
  if (op_pos == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arith prompt has no '+' or '-' operator: \"", prompt, "\""));
  }
  int64_t a = 0;
  int64_t b = 0;
  if (!ParseOperand(body.substr(0, op_pos), &a) ||
      !ParseOperand(body.substr(op_pos + 1), &b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arith prompt operands must be 1 to 18 digits: \"", prompt, "\""));
  }
  return ArithTask::MakeProblem(a, body[op_pos], b);
}

}  // namespace tandem::task
