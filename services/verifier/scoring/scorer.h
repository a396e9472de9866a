#pragma once

// The interface every verifier implements, and the request/result types it
// exchanges with the verifier service.
//
// Contract, for every Scorer:
//   1. The service calls Validate(request) for every item of a batch before
//      scoring any of them. Validate returns InvalidArgument naming the
//      metadata field that is missing or malformed (e.g. "metadata.answer is
//      required"); it never looks at whether the completion is right.
//   2. Score(request) REQUIRES Validate(request).ok(). If it is called with
//      an invalid request anyway it does not crash: it returns reward 0 with
//      outcome kOutcomeError and the validation message as reason.
//   3. A wrong, empty or malicious completion is never an error: it is a
//      ScoreResult with reward 0 and an outcome saying why.
//   4. Validate and Score are thread-safe: one Scorer instance is shared by
//      all worker threads of the service and called concurrently.

#include <array>
#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::verifier {

struct ScoreRequest {
  std::string completion_text;
  std::string prompt_text;
  // Verifier-specific inputs, e.g. "answer", "pattern", "tests", "language".
  std::map<std::string, std::string> metadata;
  // When the service stops waiting for this item (its own deadline or its
  // caller's), and the caller's cancellation. Scorers that run programs
  // (code) kill them at either and return promptly with outcome timeout and
  // ScoreResult::stopped set; in-process scorers, which are fast, ignore
  // both.
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* cancelled = nullptr;
};

// Outcome labels. They are metric label values, so the set is closed: a
// scorer only ever returns one of kAllOutcomes.
inline constexpr absl::string_view kOutcomeCorrect = "correct";
inline constexpr absl::string_view kOutcomeIncorrect = "incorrect";
// Some but not all test cases passed (reward strictly between 0 and 1).
inline constexpr absl::string_view kOutcomePartial = "partial";
inline constexpr absl::string_view kOutcomeNoAnswer = "no_answer";
inline constexpr absl::string_view kOutcomeTimeout = "timeout";
inline constexpr absl::string_view kOutcomeMemory = "memory";
inline constexpr absl::string_view kOutcomeOutputLimit = "output_limit";
// The program ran and failed (non-zero exit, killed by a signal).
inline constexpr absl::string_view kOutcomeRuntimeError = "runtime_error";
// The verifier itself failed (invalid request, internal error).
inline constexpr absl::string_view kOutcomeError = "error";
// The code sandbox could not be set up; nothing was run.
inline constexpr absl::string_view kOutcomeSandboxUnavailable =
    "sandbox_unavailable";

inline constexpr std::array<absl::string_view, 10> kAllOutcomes = {
    kOutcomeCorrect,           kOutcomeIncorrect,    kOutcomePartial,
    kOutcomeNoAnswer,          kOutcomeTimeout,      kOutcomeMemory,
    kOutcomeOutputLimit,       kOutcomeRuntimeError, kOutcomeError,
    kOutcomeSandboxUnavailable};

// Why a sandboxed run was ended by force, for the kills metric: the CPU
// limit, the wall-clock limit, the output cap, the file-size limit, or
// another fatal signal (e.g. SIGSEGV when an allocation fails).
inline constexpr absl::string_view kKillCpu = "cpu";
inline constexpr absl::string_view kKillWall = "wall_clock";
inline constexpr absl::string_view kKillOutput = "output";
inline constexpr absl::string_view kKillFileSize = "file_size";
inline constexpr absl::string_view kKillSignal = "signal";
inline constexpr absl::string_view kAllKillReasons[] = {
    kKillCpu, kKillWall, kKillOutput, kKillFileSize, kKillSignal};

struct ScoreResult {
  double reward = 0.0;  // In [0, 1].
  std::string outcome;  // One of kAllOutcomes.
  std::string reason;   // Human-readable; may quote (truncated) output.
  // One of kAllKillReasons per sandboxed run that was ended by force.
  std::vector<absl::string_view> sandbox_kills;
  // True when scoring was cut short by ScoreRequest::deadline or
  // ScoreRequest::cancelled (reward 0, outcome timeout).
  bool stopped = false;
};

class Scorer {
 public:
  virtual ~Scorer() = default;

  // Checks the request's metadata. OK or InvalidArgument naming the field.
  // Thread-safe.
  virtual absl::Status Validate(const ScoreRequest& request) const = 0;

  // Scores the completion. REQUIRES: Validate(request).ok(); see the
  // contract at the top of this file. Thread-safe.
  virtual ScoreResult Score(const ScoreRequest& request) = 0;
};

// Helpers shared by the scorers.

// Returns the metadata value of `key`, or InvalidArgument
// "metadata.<key> is required" when absent.
absl::Status RequireMetadata(const ScoreRequest& request, absl::string_view key,
                             std::string* value);

// Reads an optional boolean option ("true"/"false"/"1"/"0", any case) from
// the metadata; `default_value` when absent, InvalidArgument naming the key
// otherwise.
absl::Status ReadBoolOption(const ScoreRequest& request, absl::string_view key,
                            bool default_value, bool* value);

// Builds results; the reward of MakeResult is clamped to [0, 1].
ScoreResult MakeResult(double reward, absl::string_view outcome,
                       std::string reason);
ScoreResult InvalidRequestResult(const absl::Status& status);

// Quotes `text` for a reason string, truncated to `max_chars` bytes with an
// ellipsis so that reasons stay bounded whatever the completion is.
std::string QuoteForReason(absl::string_view text, size_t max_chars = 80);

}  // namespace tandem::verifier
