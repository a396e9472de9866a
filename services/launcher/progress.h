#pragma once

// What tandem-local shows while a run goes: one progress line (policy
// version, reward, held-out accuracy, throughput, staleness, last inflight
// pause) and the end-of-run summary. Pure formatting of status messages
// the launcher collects from the coordinator, the trainer and the rollout
// workers, so it is testable without a cluster.

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/rollout.pb.h"
#include "tandem/v1/trainer.pb.h"

namespace tandem::launcher {

struct ProgressSnapshot {
  absl::Time taken;
  tandem::v1::GetClusterStatusResponse cluster;
  // Empty when the trainer did not answer.
  std::optional<tandem::v1::TrainerStatus> trainer;
  // The rollout workers that answered.
  std::vector<tandem::v1::RolloutStatus> rollouts;
};

// e.g. "v 120 | reward 0.41 | held-out 31.2% -> 45.3% (v 120) |
//       3512 tok/s | staleness 1.3 (max 3, bound 4) | pause 52us |
//       members 5/5".
std::string FormatProgressLine(const ProgressSnapshot& snapshot);

struct RunSummary {
  // Time of the RL phase (daemons up to stop) and of the warm start.
  absl::Duration rl_time;
  absl::Duration warm_start_time;
  // Largest generated-token total seen per worker, summed.
  uint64_t generated_tokens = 0;
  // Where the trainer's checkpoints and policy export are (may be empty).
  std::string checkpoint_path;
  std::string export_path;
};

// The multi-line end-of-run summary: held-out accuracy before -> after,
// time, tokens, versions, trained groups, exported checkpoint.
std::string FormatRunSummary(const ProgressSnapshot& last,
                             const RunSummary& summary);

// Human duration: "45us", "3.2ms", "1.50s".
std::string FormatPause(double seconds);

}  // namespace tandem::launcher
