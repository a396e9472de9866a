#include "common/task/arith_task.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace tandem::task {
namespace {

// splitmix64: a small, well-mixed, portable hash/step function, so streams
// and splits are the same on every platform and standard library.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over the prompt text, then mixed; the salt keeps the split
// independent of any other use of the same hash.
uint64_t HashText(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix(h ^ 0x7461736b2d617269ULL /* "task-ari" */);
}

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

const char* SplitName(Split split) {
  return split == Split::kTrain ? "train" : "heldout";
}

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
  const uint64_t bucket = HashText(problem.prompt) % 100;
  return bucket < static_cast<uint64_t>(options_.heldout_percent)
             ? Split::kHeldOut
             : Split::kTrain;
}

ArithProblem ArithTask::Sample(Split split, uint64_t index) const {
  // Each index has its own generator state, so Sample(i) does not depend on
  // the problems before it. Rejection sampling keeps the problem's split.
  uint64_t state =
      Mix(options_.seed ^ Mix(index * 2 + (split == Split::kHeldOut ? 1 : 0)));
  const uint64_t limit = static_cast<uint64_t>(operand_limit_);
  while (true) {
    state = Mix(state);
    const int64_t a = static_cast<int64_t>(state % limit);
    state = Mix(state);
    const int64_t b = static_cast<int64_t>(state % limit);
    char op = '+';
    if (options_.subtraction) {
      state = Mix(state);
      op = (state & 1) ? '-' : '+';
    }
    ArithProblem problem = MakeProblem(a, op, b);
    if (SplitOf(problem) == split) return problem;
  }
}

std::vector<ArithProblem> ArithTask::Take(Split split, uint64_t count) const {
  std::vector<ArithProblem> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(Sample(split, i));
  return out;
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
