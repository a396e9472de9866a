#pragma once

// The episodes a server holds and the limits on them (EnvironmentConfig),
// without gRPC: the environment service is a thin adapter over this, and
// the unit test drives it directly.
//
// States: an episode is open from Open until a step ends it (answered,
// the environment's end, or a limit: max_turns, max_observation_bytes,
// episode_timeout_ms); an ended episode is held, answering
// FAILED_PRECONDITION with its end reason, until Close or until it is
// reaped after idle_timeout_ms without a call. Close and reaping free it;
// its id then answers NOT_FOUND. Thread-safe.
//
// The wall-time limit and idle reaping are timed on a Clock
// (common/base/clock.h); the deadline handed to a scorer's program stays
// real time.

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "services/verifier/environment/builtin_environments.h"
#include "services/verifier/environment/environment_config.h"
#include "services/verifier/environment/environment_metrics.h"
#include "services/verifier/scoring/scorer.h"
#include "tandem/v1/environment.pb.h"

namespace tandem::verifier {

class EpisodeTable {
 public:
  // `scorers` (the verifier's, by name) and `metrics` outlive the table.
  // `score_timeout` bounds one scoring (the verifier's item_timeout_ms).
  // `clock` (outlives the table) times episode_timeout_ms and the idle
  // time that Reap compares with idle_timeout_ms.
  EpisodeTable(const EnvironmentConfig& config,
               const std::map<std::string, std::unique_ptr<Scorer>>* scorers,
               EnvironmentMetrics* metrics,
               absl::Duration score_timeout = absl::InfiniteDuration(),
               Clock* clock = RealClock());

  // Kills the programs of running steps (their scorers return at once) and
  // makes every later step's scoring stop at once. For shutdown.
  void Cancel() { cancelled_.store(true); }

  std::vector<tandem::v1::EnvironmentInfo> List() const;
  // `owner` names who opened the episode (the caller's certificate
  // identity under mutual TLS, empty without it): only the same owner may
  // step or close it; another caller gets PERMISSION_DENIED.
  //
  // INVALID_ARGUMENT (unknown environment or verifier, bad metadata),
  // RESOURCE_EXHAUSTED (max_open_episodes), UNAVAILABLE after Cancel.
  absl::StatusOr<tandem::v1::OpenEpisodeResponse> Open(
      const tandem::v1::OpenEpisodeRequest& request,
      const std::string& owner = "");
  // Runs one step (blocking: the task's scorer may run a program). The
  // errors of Environment.Step in environment.proto.
  absl::StatusOr<tandem::v1::StepResponse> Step(
      const tandem::v1::StepRequest& request, const std::string& caller = "");
  // True when the id was held (and is now closed).
  absl::StatusOr<bool> Close(const std::string& episode_id,
                             const std::string& caller = "");
  // Frees episodes idle for idle_timeout_ms at `now` (on the table's
  // clock); returns how many.
  int Reap(absl::Time now);
  // Episodes held.
  size_t size() const;

 private:
  struct Episode {
    BuiltinEnvironment* environment = nullptr;
    EpisodeTask task;
    std::string owner;
    uint32_t turns = 0;
    bool busy = false;  // A Step runs.
    absl::Time last_call;  // on clock_
    // Opened + episode_timeout_ms, on clock_ (task.deadline is the same
    // limit in real time, for the scorer's programs).
    absl::Time deadline;
    tandem::v1::EpisodeEndReason ended =
        tandem::v1::EPISODE_END_REASON_UNSPECIFIED;
    std::string end_text;
  };

  // Ends `episode` (under mu_) and counts it.
  void End(Episode& episode, tandem::v1::EpisodeEndReason reason,
           std::string text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EnvironmentConfig config_;
  const absl::Duration score_timeout_;
  Clock* const clock_;
  std::atomic<bool> cancelled_{false};
  const std::map<std::string, std::unique_ptr<Scorer>>* const scorers_;
  EnvironmentMetrics* const metrics_;
  // Built at construction, read-only afterwards.
  std::map<std::string, std::unique_ptr<BuiltinEnvironment>> environments_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Episode>> episodes_
      ABSL_GUARDED_BY(mu_);
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::verifier
