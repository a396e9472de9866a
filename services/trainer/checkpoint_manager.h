#pragma once

// When the trainer daemon checkpoints and how it resumes (the on-disk
// format is checkpoint.h):
//   - every `every_steps` optimizer steps, on Trainer::Stop (SIGTERM) and on
//     the SaveCheckpoint RPC;
//   - on start, from <checkpoint_dir>/latest when `resume`;
//   - at the first registration, the policy version is reconciled with the
//     coordinator's, which numbers versions (ReconcileVersion).
// Thread-compatible: the trainer calls it from its training thread, or
// after that thread has been joined. last_checkpoint() is thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/trainer/checkpoint.h"

namespace tandem::trainer {

struct CheckpointPolicy {
  std::string dir;
  int64_t every_steps = 50;  // 0: no periodic checkpoints
  int64_t keep = 2;
  bool on_stop = true;
  bool resume = true;
  std::string tokenizer_dir;  // see CheckpointWriteOptions
  bool builtin_tokenizer = false;
  std::string training_config_json = "{}";
};

class CheckpointManager {
 public:
  // Registers tandem_trainer_checkpoint_{seconds,bytes_total,step} on
  // `registry`.
  CheckpointManager(CheckpointPolicy policy, prometheus::Registry* registry);

  // Asks the coordinator for its latest policy version.
  using CoordinatorVersionFn = std::function<absl::StatusOr<uint64_t>()>;

  // The checkpoint to resume from: nullopt when `resume` is off or the
  // directory holds none; an error (naming the file) when `latest` exists
  // but the checkpoint is unreadable or corrupt: a trainer must not silently
  // start over when it was meant to resume.
  // A checkpoint past version 0 while the coordinator (asked through
  // `coordinator_version`, when given) has no version at all belongs to an
  // earlier run: a new run reusing checkpoint_dir. It is not resumed (a
  // warning says so) and this run's checkpoints go next to it. When the
  // coordinator cannot be asked, the checkpoint is resumed.
  absl::StatusOr<std::optional<LoadedCheckpoint>> FindResumePoint(
      const CoordinatorVersionFn& coordinator_version = nullptr);

  // Restores `checkpoint` into `trainer` (created from checkpoint.hf_dir)
  // and logs a warning when the training configuration changed.
  absl::Status Restore(const LoadedCheckpoint& checkpoint,
                       GrpoTrainer* trainer);

  // The coordinator numbers policy versions (each publish must be its
  // version + 1). At the first registration the trainer adopts the
  // coordinator's version `coordinator_version`:
  //   equal to the trainer's: the normal resume, nothing changes;
  //   ahead: versions were published after the last checkpoint (the trainer
  //     was killed, not stopped): training continues from the checkpoint's
  //     weights, published as coordinator_version + 1 (the coordinator
  //     queued the groups of those versions again or counted them lost:
  //     ResumeTraining);
  //   behind (a coordinator without its journal) or no checkpoint at all
  //     while the coordinator has versions: the same, numbering continues
  //     from the coordinator.
  // Each case other than "equal" logs a warning naming checkpoint_dir.
  void ReconcileVersion(uint64_t coordinator_version, bool resumed,
                        GrpoTrainer* trainer);

  // After a step: writes a checkpoint when step is a multiple of
  // every_steps. Returns nullopt when nothing was due.
  absl::StatusOr<std::optional<WrittenCheckpoint>> MaybeSave(
      const GrpoTrainer& trainer);
  // Writes a checkpoint now; returns the last one written instead when the
  // trainer has not changed since. `pin_reason` non-empty pins the returned
  // checkpoint (rotation never removes it; the operator asked for it).
  absl::StatusOr<WrittenCheckpoint> Save(const GrpoTrainer& trainer,
                                         absl::string_view pin_reason = "");
  // On stop: writes when on_stop and the trainer stepped since the last
  // checkpoint (or resume).
  absl::StatusOr<std::optional<WrittenCheckpoint>> SaveOnStop(
      const GrpoTrainer& trainer);

  std::string last_checkpoint() const;
  const CheckpointPolicy& policy() const { return policy_; }

 private:
  const CheckpointPolicy policy_;
  prometheus::Histogram& seconds_;
  prometheus::Counter& bytes_;
  prometheus::Gauge& step_;
  int64_t last_step_ = -1;  // step of the last checkpoint written or read
  std::optional<WrittenCheckpoint> last_written_;

  mutable absl::Mutex mu_;
  std::string last_path_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::trainer
