#pragma once

// "code": runs the completion as a program against test cases in the
// Sandbox (see sandbox.h for what contains it).
//
// Metadata:
//   language  (required) "python" / "python3" (run by /usr/bin/python3 -I)
//             or "sh" / "shell" (run by /bin/sh).
//   tests     (required) JSON array of 1..256 objects
//             {"stdin": string (optional, default ""),
//              "expected_stdout": string}.
//
// The program is the content of the last fenced block ("```...```", the
// info string after the opening fence is ignored) of the completion, or the
// whole completion when it has no fence; an opening fence that is never
// closed runs to the end of the completion. Each test case runs in a fresh
// sandbox, the test's stdin on standard input; it passes when the program
// exits with status 0 and its stdout equals expected_stdout after removing
// trailing whitespace from every line and trailing empty lines from both.
//
// reward = passed / total. Outcome: correct when all pass, partial when
// some pass; when none pass, the first failure's kind: incorrect (wrong
// output), runtime_error (non-zero exit or a signal), timeout (CPU or
// wall-clock limit), memory (address-space limit; detected as Python's
// MemoryError), output_limit (stdout/stderr cap or the file-size limit).
// The first timeout ends the run: the remaining tests count as failed, so
// an infinite loop costs one wall-clock limit, not one per test. When the
// request's deadline passes or its caller cancels (ScoreRequest), the
// running program is killed at once, the remaining tests are not run, and
// the item is reward 0, outcome timeout, ScoreResult::stopped. An empty
// program is no_answer. When the sandbox cannot be set up the outcome is
// sandbox_unavailable and nothing runs; other sandbox failures are outcome
// error (concurrent runs as root have uids of their own, so one run's fork
// bomb does not use up another's process limit). Reward is 0 in all these cases.
//
// Thread-safe: Score() may run concurrently; each run has its own process
// and directory.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/verifier/scoring/sandbox.h"
#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

class CodeScorer final : public Scorer {
 public:
  // InvalidArgument when the sandbox config is invalid.
  static absl::StatusOr<std::unique_ptr<CodeScorer>> Create(
      const SandboxConfig& config);

  absl::Status Validate(const ScoreRequest& request) const override;
  ScoreResult Score(const ScoreRequest& request) override;

  Sandbox& SandboxForTest() { return *sandbox_; }

 private:
  explicit CodeScorer(std::unique_ptr<Sandbox> sandbox)
      : sandbox_(std::move(sandbox)) {}

  const std::unique_ptr<Sandbox> sandbox_;
};

absl::StatusOr<std::unique_ptr<Scorer>> NewCodeScorer(
    const SandboxConfig& config);

}  // namespace tandem::verifier
