#include "services/trainer/training_loop.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/model_flattening.h"
#include "services/trainer/training_batch.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::trainer {
namespace {

auto Log() { return ComponentLogger("trainer"); }

}  // namespace

TrainingLoop::TrainingLoop(TrainingLoopParts parts)
    : parts_(std::move(parts)) {}

absl::StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Create(
    TrainingLoopParts parts) {
  std::unique_ptr<TrainingLoop> loop(new TrainingLoop(std::move(parts)));
  const TrainerConfig& config = *loop->parts_.config;
  ASSIGN_OR_RETURN(std::shared_ptr<const model::ModelWeights> published,
                   loop->PublishedWeights());
  ASSIGN_OR_RETURN(weights::FlatWeightLayout layout,
                   weights::LayoutForModel(*published));
  loop->layout_ =
      std::make_unique<weights::FlatWeightLayout>(std::move(layout));
  // Sparse deltas are bf16 only (delta_publisher.h): float32 is full.
  const bool bf16 = loop->parts_.publish_dtype == model::WeightDType::kBFloat16;
  ASSIGN_OR_RETURN(loop->delta_publisher_,
                   weights::DeltaPublisher::Create(
                       {bf16, static_cast<uint64_t>(config.weight_anchor_every),
                        config.weight_delta_max_density}));
  if (loop->parts_.change_compactor != nullptr) {
    loop->delta_publisher_->set_change_compactor(loop->parts_.change_compactor);
  }
  Log()->info("publishing {} (weight_sync.anchor_every {})",
              bf16 ? "bfloat16: sparse deltas between full anchors"
                   : "float32: every version in full",
              config.weight_anchor_every);
  if (config.eval.every_versions > 0) {
    ASSIGN_OR_RETURN(loop->evaluator_,
                     HeldoutEvaluator::Create(config.eval, config.model_path));
    loop->best_policy_ = std::make_unique<BestPolicyKeeper>(BestPolicyOptions{
        config.checkpoint_dir, config.model_path, config.model_path.empty()});
  }
  return loop;
}

TrainingLoop::~TrainingLoop() { Stop(); }

void TrainingLoop::Start() {
  parts_.checkpoint_requests->SetAccepting(true);
  thread_ = std::thread([this] { Run(); });
}

void TrainingLoop::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void TrainingLoop::FinishOnStop() {
  // The thread has stopped: checkpoint what it trained, then answer
  // SaveCheckpoint calls that arrived meanwhile.
  parts_.checkpoint_requests->SetAccepting(false);
  absl::StatusOr<std::optional<WrittenCheckpoint>> written =
      std::optional<WrittenCheckpoint>();
  if (unacknowledged_step_) {
    // The coordinator may or may not have recorded that version; the
    // checkpoint before it is the last one both sides agree on.
    Log()->warn(
        "not checkpointing on stop: version {} was never acknowledged by "
        "the coordinator",
        parts_.grpo->policy_version());
  } else {
    written = parts_.checkpoints->SaveOnStop(*parts_.grpo);
  }
  if (!written.ok()) {
    Log()->error("checkpoint on stop failed: {}", written.status().ToString());
  } else if (*written) {
    RecordCheckpoint(**written);
  }
  ServeCheckpointRequests();
}

absl::Status TrainingLoop::PullBatch(
    const std::string& member, tandem::v1::PullTrainingBatchResponse* batch) {
  tandem::v1::PullTrainingBatchRequest pull;
  pull.set_member_id(member);
  pull.set_max_tokens(static_cast<uint64_t>(parts_.config->batch_max_tokens));
  pull.set_max_groups(static_cast<uint32_t>(parts_.config->batch_max_groups));
  pull.set_trainer_policy_version(parts_.grpo->policy_version());
  pull.set_wait_ms(parts_.config->pull_wait_ms);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Milliseconds(parts_.config->pull_wait_ms) +
      absl::Seconds(5)));
  return rpc::ToAbslStatus(
      parts_.coordinator->client()->PullTrainingBatch(&context, pull, batch));
}

absl::Status TrainingLoop::TrainOnce() {
  const std::string member = parts_.coordinator->member_id();
  if (member.empty()) {
    parts_.clock->SleepFor(absl::Milliseconds(100));
    return absl::OkStatus();
  }
  tandem::v1::PullTrainingBatchResponse batch;
  RETURN_IF_ERROR(PullBatch(member, &batch));
  if (batch.batch_id().empty() || batch.groups_size() == 0) {
    return absl::OkStatus();
  }
  ConvertedBatch converted = ConvertTrainingBatch(
      batch, parts_.grpo->policy().weights()->config().vocab_size);
  for (const std::string& reason : converted.refused) {
    parts_.metrics->step.RecordRefusedGroup();
    Log()->error("batch {}: left out of the step: {}", batch.batch_id(),
                 reason);
  }
  std::vector<ScoredPromptGroup>& groups = converted.groups;
  if (groups.empty()) {
    // Nothing to train and no version to commit the batch with: it is
    // handed out again after training.batch_timeout_ms (or dropped stale).
    Log()->error("batch {}: none of its {} groups can be trained",
                 batch.batch_id(), batch.groups_size());
    return absl::OkStatus();
  }
  PoisonRewardsForTest(&groups);
  ASSIGN_OR_RETURN(GrpoStepStats stats, parts_.grpo->Step(groups));
  if (stats.skipped()) {
    HandBackSkippedStep(batch.batch_id(), groups.size(), stats);
    return absl::OkStatus();
  }
  if (Log()->should_log(spdlog::level::debug)) {
    std::string ids;
    for (const auto& g : batch.groups()) {
      absl::StrAppend(&ids, ids.empty() ? "" : ",", g.group_id());
    }
    Log()->debug("stepped to version {} on batch {}: groups {}",
                 stats.policy_version, batch.batch_id(), ids);
  }
  // The step and its publish are one unit: the publish commits the batch
  // and is retried until the coordinator answers (Publish).
  HoldBeforePublishForTest(stats.policy_version, batch.batch_id());
  unacknowledged_step_ = true;
  if (absl::Status published = Publish(stats.policy_version, batch.batch_id());
      !published.ok()) {
    if (!absl::IsFailedPrecondition(published) &&
        !absl::IsNotFound(published) && !absl::IsInvalidArgument(published)) {
      return published;  // stopping
    }
    RETURN_IF_ERROR(AdoptCoordinatorVersion(published));
    stats.policy_version = parts_.grpo->policy_version();
  }
  unacknowledged_step_ = false;
  RecordStep(batch.batch_id(), groups.size(), stats);
  return absl::OkStatus();
}

void TrainingLoop::HandBackSkippedStep(const std::string& batch_id,
                                       size_t groups,
                                       const GrpoStepStats& stats) {
  // Nothing was trained: no version to publish and no batch to commit.
  // The batch goes back at once (its groups are handed out again, or
  // dropped as stale).
  parts_.metrics->step.RecordNonFinite(stats);
  Log()->warn(
      "optimizer step {} skipped: its {} is not finite (loss {}, grad norm "
      "{}); batch {} ({} groups) not trained and not committed; policy "
      "version stays {}",
      parts_.grpo->step() + 1, stats.nonfinite, stats.loss.loss,
      stats.grad_norm, batch_id, groups, stats.policy_version);
  ReleaseBatch(batch_id, absl::StrCat("optimizer step skipped: its ",
                                      stats.nonfinite, " is not finite"));
}

void TrainingLoop::RecordStep(const std::string& batch_id, size_t groups,
                              const GrpoStepStats& stats) {
  parts_.metrics->RecordStep(stats);
  Log()->info(
      "version {}: batch {}, {} groups ({} uniform, {} of them dropped, {} "
      "guided), {} tokens ({} completions with zero advantage not forwarded), "
      "reward "
      "{:.3f}, loss {:.4f}, clip {:.3f}, kl {:.4g}, grad norm {:.3f}, "
      "lr {:.3g}, {:.2f}s",
      stats.policy_version, batch_id, groups, stats.uniform_groups,
      stats.dropped_uniform_groups, stats.guided_groups, stats.trained_tokens,
      stats.skipped_sequences, stats.reward_mean, stats.loss.loss,
      stats.loss.clip_fraction, stats.loss.kl_mean, stats.grad_norm, stats.lr,
      stats.step_seconds);
  parts_.status->Update([&](tandem::v1::TrainerStatus& s) {
    s.set_step(s.step() + 1);
    s.set_policy_version(stats.policy_version);
    s.set_trained_tokens_total(s.trained_tokens_total() + stats.trained_tokens);
    s.set_last_loss(stats.loss.loss);
    s.set_last_reward_mean(stats.reward_mean);
    s.set_last_step_seconds(stats.step_seconds);
    s.set_tokens_per_second(TrainerStepMetrics::TokensPerSecond(stats));
    if (!stats.staleness.empty()) {
      int64_t sum = 0;
      int64_t max = 0;
      for (int64_t s : stats.staleness) {
        sum += s;
        max = std::max(max, s);
      }
      s.set_last_mean_staleness(static_cast<double>(sum) /
                                static_cast<double>(stats.staleness.size()));
      s.set_last_max_staleness(static_cast<uint64_t>(max));
    }
  });
}

void TrainingLoop::PoisonRewardsForTest(
    std::vector<ScoredPromptGroup>* groups) {
  static const char* const kPoisonFile =
      std::getenv("TANDEM_TEST_POISON_REWARDS_FILE");
  if (kPoisonFile == nullptr || *kPoisonFile == 0) return;
  if (!std::filesystem::exists(kPoisonFile)) return;
  Log()->warn("fault injection: NaN rewards for this batch while {} exists",
              kPoisonFile);
  for (ScoredPromptGroup& group : *groups) {
    for (ScoredCompletion& completion : group.completions) {
      completion.reward = std::numeric_limits<double>::quiet_NaN();
    }
  }
}

void TrainingLoop::ReleaseBatch(const std::string& batch_id,
                                const std::string& reason) {
  tandem::v1::ReleaseTrainingBatchRequest request;
  request.set_member_id(parts_.coordinator->member_id());
  request.set_batch_id(batch_id);
  request.set_reason(reason);
  tandem::v1::ReleaseTrainingBatchResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::Status status = parts_.coordinator->client()->ReleaseTrainingBatch(
      &context, request, &response);
  if (!status.ok()) {
    Log()->warn(
        "could not hand batch {} back ({}); it returns after "
        "training.batch_timeout_ms",
        batch_id, status.error_message());
    return;
  }
  Log()->info("handed batch {} back: {} groups ready again", batch_id,
              response.groups_released());
}

std::optional<BestPolicy> TrainingLoop::OfferBestPolicy(
    uint64_t version, const HeldoutResult& result) {
  if (best_policy_ == nullptr) return std::nullopt;
  absl::StatusOr<std::optional<BestPolicy>> offered =
      absl::FailedPreconditionError("no weights");
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights =
      parts_.grpo->SnapshotWeights();
  if (weights.ok()) {
    offered = best_policy_->Offer(**weights, result, parts_.grpo->step());
  } else {
    offered = weights.status();
  }
  if (!offered.ok()) {
    Log()->warn("keeping the best policy (version {}) failed: {}", version,
                offered.status().ToString());
  } else if (offered->has_value()) {
    Log()->info("best policy so far: version {} ({:.3f}), kept at {}", version,
                (*offered)->accuracy, (*offered)->path);
  }
  return best_policy_->best();
}

void TrainingLoop::MaybeEvaluate(bool initial) {
  if (evaluator_ == nullptr) return;
  const uint64_t version = parts_.grpo->policy_version();
  if (!initial && !evaluator_->Due(version)) return;
  if (static_cast<int64_t>(version) == last_evaluated_version_) return;
  last_evaluated_version_ = static_cast<int64_t>(version);
  absl::StatusOr<HeldoutResult> result =
      evaluator_->Evaluate(parts_.grpo->policy(), version);
  if (!result.ok()) {
    Log()->warn("held-out evaluation of version {} failed: {}", version,
                result.status().ToString());
    return;
  }
  parts_.metrics->RecordHeldout(result->accuracy(), version);
  recent_heldout_.push_back(result->accuracy());
  while (recent_heldout_.size() > kHeldoutSmoothingWindow) {
    recent_heldout_.pop_front();
  }
  double smoothed = 0.0;
  for (double a : recent_heldout_) smoothed += a;
  smoothed /= static_cast<double>(recent_heldout_.size());
  Log()->info(
      "held-out accuracy at version {}: {:.3f} ({}/{}, {:.2f}s); mean of the "
      "last {}: {:.3f}",
      version, result->accuracy(), result->correct, result->total,
      result->seconds, recent_heldout_.size(), smoothed);
  const std::optional<BestPolicy> best = OfferBestPolicy(version, *result);
  parts_.status->Update([&](tandem::v1::TrainerStatus& s) {
    s.set_heldout_smoothed_accuracy(smoothed);
    s.set_heldout_smoothed_window(
        static_cast<uint32_t>(recent_heldout_.size()));
    if (best.has_value()) {
      s.set_heldout_best_accuracy(best->accuracy);
      s.set_heldout_best_policy_version(best->policy_version);
      s.set_heldout_best_path(
          (std::filesystem::path(parts_.config->checkpoint_dir) /
           kBestPolicyLink)
              .string());
    }
    if (!s.heldout_evaluated()) {
      s.set_initial_heldout_accuracy(result->accuracy());
      s.set_initial_heldout_policy_version(version);
    }
    s.set_heldout_evaluated(true);
    s.set_heldout_accuracy(result->accuracy());
    s.set_heldout_policy_version(version);
    s.set_heldout_problems(static_cast<uint32_t>(result->total));
  });
}

void TrainingLoop::Run() {
  MaybeEvaluate(/*initial=*/true);
  while (!stopping_) {
    if (!ReconcileVersionOnce()) {
      parts_.clock->SleepFor(absl::Milliseconds(100));
      continue;
    }
    ServeCheckpointRequests();
    absl::Status status = TrainOnce();
    if (status.ok()) status = MaybeCheckpoint();
    if (status.ok()) MaybeEvaluate(/*initial=*/false);
    if (!status.ok() && !stopping_) {
      Log()->warn("training step failed: {}", status.ToString());
      parts_.clock->SleepFor(absl::Seconds(1));
    }
  }
}

void TrainingLoop::RecordCheckpoint(const WrittenCheckpoint& written) {
  parts_.status->Update([&](tandem::v1::TrainerStatus& s) {
    s.set_last_checkpoint(written.path);
  });
}

absl::Status TrainingLoop::MaybeCheckpoint() {
  ASSIGN_OR_RETURN(std::optional<WrittenCheckpoint> written,
                   parts_.checkpoints->MaybeSave(*parts_.grpo));
  if (written) RecordCheckpoint(*written);
  return absl::OkStatus();
}

void TrainingLoop::ServeCheckpointRequests() {
  std::vector<CheckpointRequestQueue::Request> requests =
      parts_.checkpoint_requests->TakeAll();
  if (requests.empty()) return;
  absl::StatusOr<WrittenCheckpoint> written = absl::UnavailableError(
      absl::StrCat("version ", parts_.grpo->policy_version(),
                   " was never acknowledged by the coordinator: not "
                   "checkpointing it"));
  if (!unacknowledged_step_) {
    written = parts_.checkpoints->Save(*parts_.grpo,
                                       "requested by the SaveCheckpoint RPC");
  }
  if (written.ok()) RecordCheckpoint(*written);
  for (CheckpointRequestQueue::Request& r : requests) {
    if (written.ok()) {
      r.response->set_path(written->path);
      r.response->set_step(static_cast<uint64_t>(written->step));
    }
    r.reactor->Finish(written.ok() ? grpc::Status::OK
                                   : rpc::ToGrpcStatus(written.status()));
  }
}

}  // namespace tandem::trainer
