#pragma once

// The built-in synthetic arithmetic task: multi-digit addition and
// subtraction problems, generated from a seed, split deterministically into
// train and held-out problems.
//
// A problem is written as the prompt "123+456=" and is answered by the
// digits of the result, with a leading '-' when it is negative ("579",
// "-333"). Operands are uniform in [0, 10^digits).
//
// The split depends only on the problem (a hash of its prompt text with a
// fixed salt), never on the generator seed, so train and held-out problems
// are disjoint across every seed and every run. Problem streams are pure
// functions of (options, split, index): the same index always yields the
// same problem, which makes epochs and restarts reproducible.
//
// Thread safety: immutable after construction; all methods are const.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/task/task_split.h"

namespace tandem::task {

struct ArithTaskOptions {
  // Digits of each operand, in [1, 18].
  int digits = 3;
  // Whether '-' problems are generated (otherwise only '+').
  bool subtraction = true;
  // Percent of all problems that belong to the held-out split, in [1, 99].
  int heldout_percent = 10;
  // Seed of the problem streams.
  uint64_t seed = 0;
};

struct ArithProblem {
  int64_t a = 0;
  int64_t b = 0;
  char op = '+';  // '+' or '-'
  // "a<op>b=", e.g. "123+456=".
  std::string prompt;
  // The result's digits, e.g. "579" or "-333".
  std::string answer;
  // Stable id naming the problem, e.g. "arith-123+456".
  std::string id;
};

class ArithTask {
 public:
  // Checks the option ranges; errors name the field and value.
  static absl::StatusOr<ArithTask> Create(const ArithTaskOptions& options);

  // The problem a<op>b (no range check on the operands).
  static ArithProblem MakeProblem(int64_t a, char op, int64_t b);

  // The split that a problem belongs to.
  Split SplitOf(const ArithProblem& problem) const;

  // Problem number `index` of the seeded stream of `split`. Streams repeat
  // problems only by chance (sampling with replacement).
  ArithProblem Sample(Split split, uint64_t index) const;

  // The first `count` problems of the stream of `split`.
  std::vector<ArithProblem> Take(Split split, uint64_t count) const;

  const ArithTaskOptions& options() const { return options_; }

 private:
  explicit ArithTask(const ArithTaskOptions& options) : options_(options) {}
  ArithTaskOptions options_;
  int64_t operand_limit_ = 0;  // 10^digits
};

// Parses an arith prompt ("12+34=") back into a problem; errors say what is
// wrong. Used to check datasets and by tests.
absl::StatusOr<ArithProblem> ParseArithPrompt(const std::string& prompt);

}  // namespace tandem::task
