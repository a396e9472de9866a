#include "services/trainer/checkpoint_manager.h"

#include <utility>

#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem::trainer {
namespace {

auto Log() { return ComponentLogger("trainer"); }

}  // namespace

CheckpointManager::CheckpointManager(CheckpointPolicy policy,
                                     prometheus::Registry* registry)
    : policy_(std::move(policy)),
      seconds_(
          prometheus::BuildHistogram()
              .Name("tandem_trainer_checkpoint_seconds")
              .Help("Time to write one checkpoint.")
              .Register(*registry)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{
                       0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300})),
      bytes_(prometheus::BuildCounter()
                 .Name("tandem_trainer_checkpoint_bytes_total")
                 .Help("Bytes written to checkpoints.")
                 .Register(*registry)
                 .Add({})),
      step_(prometheus::BuildGauge()
                .Name("tandem_trainer_checkpoint_step")
                .Help("Optimizer step of the newest checkpoint.")
                .Register(*registry)
                .Add({})) {}

absl::StatusOr<std::optional<LoadedCheckpoint>>
CheckpointManager::FindResumePoint(
    const CoordinatorVersionFn& coordinator_version) {
  absl::StatusOr<std::string> latest = FindLatestCheckpoint(policy_.dir);
  if (!policy_.resume) {
    if (latest.ok()) {
      Log()->warn(
          "resume is off: not resuming from {}; this trainer's checkpoints "
          "replace and prune the step-* directories in {}",
          *latest, policy_.dir);
    }
    return std::nullopt;
  }
  if (absl::IsNotFound(latest.status())) {
    Log()->info("no checkpoint in {}: starting from the initial policy",
                policy_.dir);
    return std::nullopt;
  }
  if (!latest.ok()) return latest.status();
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(*latest);
  if (!loaded.ok()) return loaded.status();
  if (coordinator_version && loaded->state.policy_version > 0) {
    absl::StatusOr<uint64_t> theirs = coordinator_version();
    if (!theirs.ok()) {
      Log()->warn(
          "cannot ask the coordinator for its policy version ({}); "
          "resuming {}",
          theirs.status().ToString(), loaded->path);
    } else if (*theirs == 0) {
      Log()->warn(
          "not resuming {} (policy version {}): the coordinator has no policy "
          "version yet, so the checkpoint belongs to an earlier run; starting "
          "from the initial policy (give each run its own checkpoint_dir)",
          loaded->path, loaded->state.policy_version);
      return std::nullopt;
    }
  }
  return std::optional<LoadedCheckpoint>(*std::move(loaded));
}

absl::Status CheckpointManager::Restore(const LoadedCheckpoint& checkpoint,
                                        GrpoTrainer* trainer) {
  if (absl::Status s = RestoreFromCheckpoint(checkpoint, trainer); !s.ok()) {
    return s;
  }
  if (checkpoint.training_config_json != policy_.training_config_json) {
    Log()->warn(
        "resuming {} under a different training configuration: checkpoint "
        "{} vs now {}",
        checkpoint.path, checkpoint.training_config_json,
        policy_.training_config_json);
  }
  last_step_ = checkpoint.state.step;
  step_.Set(static_cast<double>(last_step_));
  {
    absl::MutexLock lock(&mu_);
    last_path_ = checkpoint.path;
  }
  Log()->info("resumed from {}: step {}, policy version {}", checkpoint.path,
              checkpoint.state.step, checkpoint.state.policy_version);
  return absl::OkStatus();
}

void CheckpointManager::ReconcileVersion(uint64_t coordinator_version,
                                         bool resumed, GrpoTrainer* trainer) {
  const uint64_t ours = trainer->policy_version();
  if (coordinator_version == ours) return;
  if (!resumed) {
    Log()->warn(
        "the coordinator is at policy version {} but there is no checkpoint "
        "to resume from in checkpoint_dir {} (resume: {}): training restarts "
        "from the initial policy, published as version {}",
        coordinator_version, policy_.dir, policy_.resume,
        coordinator_version + 1);
  } else if (coordinator_version > ours) {
    Log()->warn(
        "the checkpoint in {} is at policy version {}, the coordinator at {}: "
        "the versions after the checkpoint are lost from these weights (the "
        "trainer was killed before it could checkpoint; the coordinator "
        "trains their groups again or counts them lost); continuing from "
        "the checkpoint as version {}",
        policy_.dir, ours, coordinator_version, coordinator_version + 1);
  } else {
    Log()->warn(
        "the checkpoint in {} is at policy version {}, ahead of the "
        "coordinator's {} (a coordinator that lost its state?); numbering "
        "continues from the coordinator's version",
        policy_.dir, ours, coordinator_version);
  }
  trainer->set_policy_version(coordinator_version);
}

absl::StatusOr<WrittenCheckpoint> CheckpointManager::Save(
    const GrpoTrainer& trainer, absl::string_view pin_reason) {
  if (last_written_ && last_written_->step == trainer.step() &&
      last_written_->policy_version == trainer.policy_version()) {
    // Nothing changed since.
    if (!pin_reason.empty()) {
      RETURN_IF_ERROR(PinCheckpoint(last_written_->path, pin_reason));
    }
    return *last_written_;
  }
  CheckpointWriteOptions options;
  options.dir = policy_.dir;
  options.keep = policy_.keep;
  options.tokenizer_dir = policy_.tokenizer_dir;
  options.builtin_tokenizer = policy_.builtin_tokenizer;
  options.training_config_json = policy_.training_config_json;
  absl::StatusOr<WrittenCheckpoint> written = WriteCheckpoint(trainer, options);
  if (!written.ok()) return written.status();
  if (!pin_reason.empty()) {
    // Pinned at once, so no later write's rotation removes it; a failure is
    // reported to the caller that asked for it.
    RETURN_IF_ERROR(PinCheckpoint(written->path, pin_reason));
  }
  last_step_ = written->step;
  last_written_ = *written;
  step_.Set(static_cast<double>(written->step));
  seconds_.Observe(written->seconds);
  bytes_.Increment(static_cast<double>(written->bytes));
  Log()->info("checkpoint {}: step {}, policy version {}, {} bytes in {:.2f}s",
              written->path, written->step, written->policy_version,
              written->bytes, written->seconds);
  absl::MutexLock lock(&mu_);
  last_path_ = written->path;
  return written;
}

absl::StatusOr<std::optional<WrittenCheckpoint>> CheckpointManager::MaybeSave(
    const GrpoTrainer& trainer) {
  if (policy_.every_steps <= 0 || trainer.step() == last_step_ ||
      trainer.step() == 0 || trainer.step() % policy_.every_steps != 0) {
    return std::nullopt;
  }
  absl::StatusOr<WrittenCheckpoint> written = Save(trainer);
  if (!written.ok()) return written.status();
  return std::optional<WrittenCheckpoint>(*std::move(written));
}

absl::StatusOr<std::optional<WrittenCheckpoint>> CheckpointManager::SaveOnStop(
    const GrpoTrainer& trainer) {
  if (!policy_.on_stop || trainer.step() == 0 || trainer.step() == last_step_) {
    return std::nullopt;
  }
  absl::StatusOr<WrittenCheckpoint> written = Save(trainer);
  if (!written.ok()) return written.status();
  return std::optional<WrittenCheckpoint>(*std::move(written));
}

std::string CheckpointManager::last_checkpoint() const {
  absl::MutexLock lock(&mu_);
  return last_path_;
}

}  // namespace tandem::trainer
