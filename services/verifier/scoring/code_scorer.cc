#include "services/verifier/scoring/code_scorer.h"

#include <signal.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::verifier {
namespace {

constexpr size_t kMaxTests = 256;
constexpr char kPythonPath[] = "/usr/bin/python3";
constexpr char kShellPath[] = "/bin/sh";

struct TestCase {
  std::string stdin_data;
  std::string expected_stdout;
};

struct CodeTask {
  std::vector<std::string> argv;
  std::string file_name;
  std::vector<TestCase> tests;
};

absl::StatusOr<CodeTask> ParseTask(const ScoreRequest& request) {
  CodeTask task;
  std::string language;
  RETURN_IF_ERROR(RequireMetadata(request, "language", &language));
  if (language == "python" || language == "python3") {
    task.file_name = "main.py";
    task.argv = {kPythonPath, "-I", "-B", task.file_name};
  } else if (language == "sh" || language == "shell") {
    task.file_name = "main.sh";
    task.argv = {kShellPath, task.file_name};
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata.language must be one of python, python3, sh, shell; got ",
        QuoteForReason(language)));
  }

  std::string tests_json;
  RETURN_IF_ERROR(RequireMetadata(request, "tests", &tests_json));
  const nlohmann::json tests =
      nlohmann::json::parse(tests_json, nullptr, /*allow_exceptions=*/false);
  if (tests.is_discarded()) {
    return absl::InvalidArgumentError("metadata.tests is not valid JSON");
  }
  if (!tests.is_array() || tests.empty() || tests.size() > kMaxTests) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata.tests must be a JSON array of 1 to ", kMaxTests,
                     " test cases"));
  }
  for (size_t i = 0; i < tests.size(); ++i) {
    const nlohmann::json& t = tests[i];
    const std::string where = absl::StrCat("metadata.tests[", i, "]");
    if (!t.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " must be an object"));
    }
    TestCase test;
    auto in = t.find("stdin");
    if (in != t.end()) {
      if (!in->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".stdin must be a string"));
      }
      test.stdin_data = in->get<std::string>();
    }
    auto out = t.find("expected_stdout");
    if (out == t.end() || !out->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".expected_stdout must be a string"));
    }
    test.expected_stdout = out->get<std::string>();
    task.tests.push_back(std::move(test));
  }
  return task;
}

// The last fenced block of the completion, or all of it (see header).
std::string ExtractProgram(absl::string_view completion) {
  std::vector<absl::string_view> lines = absl::StrSplit(completion, '\n');
  std::optional<std::string> last_block;
  std::optional<std::string> open_block;
  for (absl::string_view line : lines) {
    const bool fence =
        absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "```");
    if (fence) {
      if (open_block) {
        last_block = std::move(open_block);
        open_block.reset();
      } else {
        open_block.emplace();
      }
    } else if (open_block) {
      absl::StrAppend(&*open_block, line, "\n");
    }
  }
  if (open_block) last_block = std::move(open_block);
  return last_block ? *last_block : std::string(completion);
}

// Lines without trailing whitespace, without trailing empty lines.
std::vector<std::string> NormalizedLines(absl::string_view text) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    lines.emplace_back(absl::StripTrailingAsciiWhitespace(line));
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// The end of a program's stderr, where the error usually is, quoted.
std::string Tail(absl::string_view text, size_t max_chars = 200) {
  text = absl::StripTrailingAsciiWhitespace(text);
  if (text.size() <= max_chars) return QuoteForReason(text, max_chars);
  return absl::StrCat(
      "...", QuoteForReason(text.substr(text.size() - max_chars), max_chars));
}

std::string SignalName(int signal) {
  const char* description = sigdescr_np(signal);  // Thread-safe.
  return description != nullptr ? description : "unknown signal";
}

struct TestVerdict {
  bool passed = false;
  absl::string_view failure;  // Outcome label when not passed.
  std::string detail;
  absl::string_view kill;  // kAllKillReasons; empty when not ended by force.
};

TestVerdict Judge(const SandboxResult& run, const TestCase& test,
                  const SandboxLimits& limits) {
  TestVerdict v;
  switch (run.termination) {
    case SandboxTermination::kStopped:
      v.failure = kOutcomeTimeout;
      v.detail = "stopped: the item's deadline passed or its caller cancelled";
      return v;
    case SandboxTermination::kWallTimeout:
      v.kill = kKillWall;
      v.failure = kOutcomeTimeout;
      v.detail = absl::StrCat("wall-clock limit of ", limits.wall_seconds,
                              " s exceeded");
      return v;
    case SandboxTermination::kOutputLimit:
      v.kill = kKillOutput;
      v.failure = kOutcomeOutputLimit;
      v.detail =
          absl::StrCat("output exceeded ", limits.max_output_bytes, " bytes");
      return v;
    case SandboxTermination::kSignaled: {
      const bool cpu = run.signal == SIGXCPU ||
                       (run.signal == SIGKILL &&
                        run.cpu_time >= absl::Seconds(limits.cpu_seconds));
      if (cpu) {
        v.kill = kKillCpu;
        v.failure = kOutcomeTimeout;
        v.detail =
            absl::StrCat("CPU limit of ", limits.cpu_seconds, " s exceeded");
      } else if (run.signal == SIGXFSZ) {
        v.kill = kKillFileSize;
        v.failure = kOutcomeOutputLimit;
        v.detail = absl::StrCat("file size limit of ", limits.file_size_bytes,
                                " bytes exceeded");
      } else {
        v.kill = kKillSignal;
        v.failure = kOutcomeRuntimeError;
        v.detail = absl::StrCat("killed by signal ", run.signal, " (",
                                SignalName(run.signal), "); stderr ",
                                Tail(run.stderr_data));
      }
      return v;
    }
    case SandboxTermination::kExited:
      break;
  }
  if (run.exit_code != 0) {
    if (absl::StrContains(run.stderr_data, "MemoryError") ||
        absl::StrContains(run.stderr_data, "Cannot allocate memory")) {
      v.failure = kOutcomeMemory;
      v.detail = absl::StrCat("address-space limit of ",
                              limits.address_space_bytes, " bytes exceeded");
    } else if (absl::StrContains(run.stderr_data, "File too large")) {
      v.failure = kOutcomeOutputLimit;
      v.detail = absl::StrCat("file size limit of ", limits.file_size_bytes,
                              " bytes exceeded");
    } else {
      v.failure = kOutcomeRuntimeError;
      v.detail = absl::StrCat("exit status ", run.exit_code, "; stderr ",
                              Tail(run.stderr_data));
    }
    return v;
  }
  if (NormalizedLines(run.stdout_data) ==
      NormalizedLines(test.expected_stdout)) {
    v.passed = true;
    return v;
  }
  v.failure = kOutcomeIncorrect;
  v.detail = absl::StrCat("expected ", QuoteForReason(test.expected_stdout),
                          ", got ", QuoteForReason(run.stdout_data));
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CodeScorer>> CodeScorer::Create(
    const SandboxConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<Sandbox> sandbox, Sandbox::Create(config));
  return std::unique_ptr<CodeScorer>(new CodeScorer(std::move(sandbox)));
}

absl::Status CodeScorer::Validate(const ScoreRequest& request) const {
  return ParseTask(request).status();
}

ScoreResult CodeScorer::Score(const ScoreRequest& request) {
  absl::StatusOr<CodeTask> task = ParseTask(request);
  if (!task.ok()) return InvalidRequestResult(task.status());
  const std::string program = ExtractProgram(request.completion_text);
  if (absl::StripAsciiWhitespace(program).empty()) {
    return MakeResult(0.0, kOutcomeNoAnswer, "completion has no program");
  }

  const SandboxLimits& limits = sandbox_->config().limits;
  const size_t total = task->tests.size();
  size_t passed = 0;
  std::optional<TestVerdict> first_failure;
  size_t first_failure_index = 0;
  std::vector<absl::string_view> kills;
  for (size_t i = 0; i < total; ++i) {
    SandboxCommand command;
    command.argv = task->argv;
    command.stdin_data = task->tests[i].stdin_data;
    command.files = {{task->file_name, program}};
    command.deadline = request.deadline;
    command.cancelled = request.cancelled;
    absl::StatusOr<SandboxResult> run = sandbox_->Run(command);
    if (!run.ok() && (absl::IsDeadlineExceeded(run.status()) ||
                      absl::IsCancelled(run.status()))) {
      ScoreResult result = MakeResult(
          0.0, kOutcomeTimeout,
          absl::StrCat("passed ", passed, "/", total, " tests; test ", i + 1,
                       " not run: ", run.status().message()));
      result.sandbox_kills = std::move(kills);
      result.stopped = true;
      return result;
    }
    if (!run.ok()) {
      const bool unavailable = absl::IsUnavailable(run.status());
      return MakeResult(
          0.0, unavailable ? kOutcomeSandboxUnavailable : kOutcomeError,
          absl::StrCat("test ", i + 1, " of ", total,
                       " not run: ", run.status().message()));
    }
    TestVerdict verdict = Judge(*run, task->tests[i], limits);
    if (run->termination == SandboxTermination::kStopped) {
      ScoreResult result = MakeResult(
          0.0, kOutcomeTimeout,
          absl::StrCat("passed ", passed, "/", total, " tests; test ", i + 1,
                       " ", verdict.detail));
      result.sandbox_kills = std::move(kills);
      result.stopped = true;
      return result;
    }
    if (!verdict.kill.empty()) kills.push_back(verdict.kill);
    if (verdict.passed) {
      ++passed;
      continue;
    }
    if (!first_failure) {
      first_failure = verdict;
      first_failure_index = i;
    }
    if (verdict.failure == kOutcomeTimeout) break;
  }

  const double reward = static_cast<double>(passed) / total;
  std::string reason = absl::StrCat("passed ", passed, "/", total, " tests");
  if (first_failure) {
    absl::StrAppend(&reason, "; test ", first_failure_index + 1, " ",
                    first_failure->failure, ": ", first_failure->detail);
  }
  ScoreResult result =
      passed == total ? MakeResult(1.0, kOutcomeCorrect, reason)
      : passed > 0    ? MakeResult(reward, kOutcomePartial, reason)
                      : MakeResult(0.0, first_failure->failure, reason);
  result.sandbox_kills = std::move(kills);
  return result;
}

absl::StatusOr<std::unique_ptr<Scorer>> NewCodeScorer(
    const SandboxConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<CodeScorer> scorer,
                   CodeScorer::Create(config));
  return std::unique_ptr<Scorer>(std::move(scorer));
}

}  // namespace tandem::verifier
