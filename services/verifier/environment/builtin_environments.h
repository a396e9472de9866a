#pragma once

// The environments the verifier hosts itself:
//   calculator  – the model may call calculator(expression) (calculator.h,
//                 evaluated in process) any number of turns; a turn without
//                 a tool call is its answer, scored by the task's scorer.
//   single_turn – the first turn is the answer, scored by the task's
//                 scorer: every existing task works as an episode.

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/verifier/environment/environment_metrics.h"
#include "services/verifier/scoring/scorer.h"
#include "tandem/v1/environment.pb.h"

namespace tandem::verifier {

// The task of an episode, as opened.
struct EpisodeTask {
  std::string task_id;
  std::string prompt_text;
  Scorer* scorer = nullptr;  // The task's verifier; owned by the Verifier.
  std::map<std::string, std::string> metadata;
  absl::Time deadline = absl::InfiniteFuture();
  // One scoring's own limit (the verifier's item_timeout_ms): a scorer
  // gets min(deadline, now + score_timeout).
  absl::Duration score_timeout = absl::InfiniteDuration();
  // Set when the server stops: a running program is killed.
  const std::atomic<bool>* cancelled = nullptr;
};

// What one step did.
struct StepResult {
  std::vector<tandem::v1::Observation> observations;
  bool done = false;
  std::optional<double> reward;
  tandem::v1::EpisodeEndReason end_reason =
      tandem::v1::EPISODE_END_REASON_UNSPECIFIED;
  std::string end_text;
  std::string outcome;
};

// A built-in environment. Stateless between steps (an episode's state is
// its task and turn count, kept by the service), so one instance serves
// every episode; Step is thread-safe.
class BuiltinEnvironment {
 public:
  virtual ~BuiltinEnvironment() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  // OpenAI `tools` JSON array.
  virtual std::string tools_json() const = 0;
  virtual StepResult Step(const EpisodeTask& task,
                          const tandem::v1::Action& action,
                          EnvironmentMetrics& metrics) = 0;
};

// Scores `text` with the task's scorer: done, reward, reason answered (or
// error when the scorer itself failed).
StepResult ScoreAnswer(const EpisodeTask& task, const std::string& text);

std::unique_ptr<BuiltinEnvironment> MakeCalculatorEnvironment();
std::unique_ptr<BuiltinEnvironment> MakeSingleTurnEnvironment();

}  // namespace tandem::verifier
