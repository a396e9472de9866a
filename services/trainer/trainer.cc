#include "services/trainer/trainer.h"

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/device.h"
#include "common/model/model_loader.h"
#include "common/model/model_weights.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/model_flattening.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/reference_policy.h"
#include "services/trainer/training_batch.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::trainer {
namespace {

auto Log() { return ComponentLogger("trainer"); }

// What GracefulStop keeps of its deadline for the work after the broadcast
// drain: the checkpoint on stop and the gRPC shutdown (member_->Shutdown).
constexpr absl::Duration kStopReserve = absl::Seconds(2);

// The coordinator's latest policy version (one short retried call).
absl::StatusOr<uint64_t> CoordinatorPolicyVersion(
    const std::string& address, const rpc::TlsOptions& tls) {
  auto stub =
      tandem::v1::Coordinator::NewStub(rpc::MakeChannel(address, tls));
  rpc::RetryPolicy retry;
  retry.attempt_timeout = absl::Seconds(2);
  retry.total_timeout = absl::Seconds(5);
  tandem::v1::GetClusterStatusResponse response;
  RETURN_IF_ERROR(rpc::CallWithRetry(
      "GetClusterStatus", retry, [&](grpc::ClientContext* context) {
        return stub->GetClusterStatus(
            context, tandem::v1::GetClusterStatusRequest(), &response);
      }));
  return response.policy_version();
}

CheckpointPolicy ToCheckpointPolicy(const TrainerConfig& c) {
  CheckpointPolicy p;
  p.dir = c.checkpoint_dir;
  p.every_steps = c.checkpoint_every;
  p.keep = c.checkpoint_keep;
  p.on_stop = c.checkpoint_on_stop;
  p.resume = c.resume;
  p.tokenizer_dir = c.model_path;
  p.builtin_tokenizer = c.model_path.empty();
  p.training_config_json = TrainingConfigJson(c);
  return p;
}

GrpoTrainerOptions ToOptions(const TrainerConfig& c) {
  GrpoTrainerOptions o;
  o.lr = c.lr;
  o.warmup_steps = c.warmup_steps;
  o.schedule = c.schedule == "cosine"   ? LrSchedule::kCosine
               : c.schedule == "linear" ? LrSchedule::kLinear
                                        : LrSchedule::kConstant;
  o.total_steps = c.total_steps;
  o.min_lr_ratio = c.min_lr_ratio;
  o.micro_batch_tokens = c.micro_batch_tokens;
  o.max_grad_norm = c.max_grad_norm;
  o.loss.clip_low = c.clip_low;
  o.loss.clip_high = c.clip_high;
  o.loss.kl_beta = c.kl_beta;
  o.loss.advantage = c.advantage == "dr_grpo"
                         ? AdvantageNormalization::kGroupMean
                         : AdvantageNormalization::kGroupMeanStd;
  o.loss.aggregation =
      c.aggregation == "sequence"     ? LossAggregation::kSequenceMean
      : c.aggregation == "pipelinerl" ? LossAggregation::kSumOverSequences
                                      : LossAggregation::kTokenMean;
  o.drop_uniform_groups = c.dynamic_sampling;
  o.reference_guidance = c.guide_failed_groups;
  o.reference_reward = c.guide_reward;
  o.logprobs.kernel = c.logprobs_kernel == "cuda"   ? TokenLogProbsKernel::kCuda
                      : c.logprobs_kernel == "aten" ? TokenLogProbsKernel::kAten
                                                    : TokenLogProbsKernel::kAuto;
  return o;
}

}  // namespace

Trainer::Trainer(const TrainerConfig& config)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      // With shared memory on, each FULL version is copied into its
      // /dev/shm segment when it is published (on the training thread), so
      // serving a same-host pull copies nothing (weight_store.h).
      store_(4, config.weight_shared_memory
                    ? weights::WeightStore::SharedMemory::kAtPut
                    : weights::WeightStore::SharedMemory::kOnRequest) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Trainer> trainer(new Trainer(config));
  trainer->checkpoints_ = std::make_unique<CheckpointManager>(
      ToCheckpointPolicy(config), trainer->registry_.get());
  // A checkpoint to resume from replaces the initial policy: its hf/ is a
  // Hugging Face directory with the fp32 master weights.
  ASSIGN_OR_RETURN(
      std::optional<LoadedCheckpoint> resumed,
      trainer->checkpoints_->FindResumePoint([&config] {
        return CoordinatorPolicyVersion(config.coordinator_address,
                                        config.server.tls);
      }));
  trainer->resumed_ = resumed.has_value();
  ASSIGN_OR_RETURN(
      model::LoadedModel model,
      model::LoadModel(resumed ? resumed->hf_dir : config.model_path,
                       config.model_seed,
                       static_cast<int32_t>(config.torch_threads),
                       // The float32 master weights, on the device.
                       {.device = config.device, .dtype = "float32"}));
  ASSIGN_OR_RETURN(const model::DeviceName device,
                   model::ParseDeviceName("model.device", config.device));
  ASSIGN_OR_RETURN(const std::optional<model::WeightDType> requested,
                   model::ParseDTypeName("model.dtype", config.dtype));
  GrpoTrainerOptions options = ToOptions(config);
  options.compute_dtype =
      model::ResolveDType(requested, device, model::WeightDType::kFloat32);
  Log()->info("policy: {}; forward and backward in {}{}", model.description,
              std::string(model::WeightDTypeName(options.compute_dtype)),
              options.compute_dtype == model::WeightDType::kFloat32
                  ? ""
                  : " (mixed precision: float32 master weights and AdamW "
                    "state)");
  ASSIGN_OR_RETURN(trainer->grpo_,
                   GrpoTrainer::Create(*model.decoder->weights(), 0, options));
  // The KL reference is the starting policy (or training.reference_model),
  // also when the trained policy resumes from a checkpoint.
  ASSIGN_OR_RETURN(
      std::shared_ptr<model::ModelWeights> reference,
      LoadReferencePolicy(config, model.decoder->weights()->config()));
  if (reference == nullptr && !config.reference_model.empty()) {
    Log()->warn(
        "training.reference_model {} is not loaded: training.kl_beta "
        "is 0",
        config.reference_model);
  }
  if (reference != nullptr) {
    RETURN_IF_ERROR(trainer->grpo_->SetReferencePolicy(*reference));
    Log()->info("KL penalty {} to the frozen reference policy {}",
                config.kl_beta,
                config.reference_model.empty()
                    ? (config.model_path.empty() ? "(built-in initial model)"
                                                 : config.model_path)
                    : config.reference_model);
  }
  if (resumed) {
    RETURN_IF_ERROR(
        trainer->checkpoints_->Restore(*resumed, trainer->grpo_.get()));
    trainer->status_.Update([&](tandem::v1::TrainerStatus& s) {
      s.set_step(static_cast<uint64_t>(trainer->grpo_->step()));
      s.set_policy_version(trainer->grpo_->policy_version());
      s.set_last_checkpoint(resumed->path);
    });
    trainer->metrics_.policy_version.Set(
        static_cast<double>(trainer->grpo_->policy_version()));
  }
  // Rollout workers load model.path in its own dtype (e.g. bfloat16) and
  // receive versions in that layout; the trainer keeps fp32 master weights
  // (and a resumed checkpoint stores them), so it publishes converted.
  trainer->publish_dtype_ = model.stored_dtype;
  if (resumed && !config.model_path.empty()) {
    ASSIGN_OR_RETURN(model::ModelConfig original,
                     model::ReadModelConfig(config.model_path));
    trainer->publish_dtype_ = original.dtype;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> published,
                   trainer->PublishedWeights());
  ASSIGN_OR_RETURN(weights::FlatWeightLayout layout,
                   weights::LayoutForModel(*published));
  trainer->layout_ =
      std::make_unique<weights::FlatWeightLayout>(std::move(layout));
  // Sparse deltas are bf16 only (delta_publisher.h): float32 is full.
  const bool bf16 = trainer->publish_dtype_ == model::WeightDType::kBFloat16;
  ASSIGN_OR_RETURN(trainer->delta_publisher_,
                   weights::DeltaPublisher::Create(
                       {bf16, static_cast<uint64_t>(config.weight_anchor_every),
                        config.weight_delta_max_density}));
  Log()->info("publishing {} (weight_sync.anchor_every {})",
              bf16 ? "bfloat16: sparse deltas between full anchors"
                   : "float32: every version in full",
              config.weight_anchor_every);
  trainer->weight_sync_metrics_ =
      std::make_unique<weights::WeightSyncMetrics>(*trainer->registry_);
  if (config.server.tls.enabled()) {
    trainer->data_plane_key_ = std::make_shared<weights::DataPlaneKeyHolder>();
  }
  trainer->weight_server_ = std::make_unique<weights::WeightServerService>(
      &trainer->store_,
      weights::WeightServerOptions{
          .metrics = trainer->weight_sync_metrics_.get(),
          // Where the gRPC server listens, so a worker that reached gRPC
          // (another host, a container) reaches the data port too.
          .data_host = config::HostOfAddress(config.server.grpc_address),
          .data_port = static_cast<uint16_t>(config.weight_data_port),
          .shared_memory = config.weight_shared_memory,
          .max_data_connections =
              static_cast<int>(config.weight_data_max_connections),
          .data_stream_threads = static_cast<int>(config.weight_data_threads),
          .data_request_timeout =
              absl::Milliseconds(config.weight_data_request_timeout_ms),
          .data_send_timeout =
              absl::Milliseconds(config.weight_data_send_timeout_ms),
          .tls_enabled = config.server.tls.enabled(),
          .auth_refused = &trainer->metrics_.auth_refused,
          // Under mTLS the raw data port admits only holders of the
          // coordinator's current data-plane secret.
          .data_plane_key = trainer->data_plane_key_});
  if (config.eval.every_versions > 0) {
    ASSIGN_OR_RETURN(trainer->evaluator_,
                     HeldoutEvaluator::Create(config.eval));
    const CheckpointPolicy policy = ToCheckpointPolicy(config);
    trainer->best_policy_ =
        std::make_unique<BestPolicyKeeper>(BestPolicyOptions{
            policy.dir, policy.tokenizer_dir, policy.builtin_tokenizer});
  }
  Trainer* self = trainer.get();
  trainer->service_ = std::make_unique<TrainerService>(
      &trainer->status_, &trainer->checkpoint_requests_, config.train,
      [self] {
        return self->member_ != nullptr ? self->member_->session().member_id()
                                        : std::string();
      },
      config.server.tls.enabled(), &trainer->metrics_.auth_refused);
  std::map<std::string, std::string> capabilities;
  if (config.weight_broadcast) {
    weights::BroadcastSenderOptions broadcast;
    broadcast.store_host =
        config.weight_store_host.empty()
            ? config::ReachableHostOf(config.server.grpc_address)
            : config.weight_store_host;
    broadcast.store_port = static_cast<uint16_t>(config.weight_store_port);
    broadcast.bind_host = broadcast.store_host;
    broadcast.timeout = absl::Milliseconds(config.weight_broadcast_timeout_ms);
    ASSIGN_OR_RETURN(
        trainer->publisher_,
        WeightPublisher::Create(broadcast, &trainer->store_,
                                trainer->weight_sync_metrics_.get()));
    capabilities["weight_broadcast_store"] =
        trainer->publisher_->store_address();
    Log()->info("weight broadcast rendezvous store on {}",
                trainer->publisher_->store_address());
  }
  ASSIGN_OR_RETURN(trainer->member_,
                   cluster::MemberDaemon::Create(
                       "trainer", tandem::v1::ROLE_TRAINER, config.server,
                       config.coordinator_address, trainer->registry_,
                       {trainer->service_.get(), trainer->weight_server_.get()},
                       [self](tandem::v1::HeartbeatRequest* r) {
                         r->set_policy_version(self->grpo_->policy_version());
                         if (self->stopping_) {
                           r->set_state(tandem::v1::MEMBER_STATE_DRAINING);
                         }
                       },
                       std::move(capabilities),
                       trainer->data_plane_key_ == nullptr
                           ? nullptr
                           : weights::DataPlaneSecretSink(
                                 trainer->data_plane_key_, "trainer")));
  return trainer;
}

Trainer::~Trainer() { Stop(); }

absl::Status Trainer::Start() {
  if (publisher_) {
    cluster::MemberSession* session = &member_->session();
    publisher_->Start(WeightPublisher::Coordinator{
        .stub = session->stub(),
        .member_id = [session] { return session->member_id(); }});
  }
  RETURN_IF_ERROR(member_->Start());
  if (config_.train) {
    checkpoint_requests_.SetAccepting(true);
    training_thread_ = std::thread([this] { TrainingLoop(); });
  }
  return absl::OkStatus();
}

absl::Status Trainer::TrainOnce() {
  const std::string member = member_->session().member_id();
  if (member.empty()) {
    absl::SleepFor(absl::Milliseconds(100));
    return absl::OkStatus();
  }
  tandem::v1::PullTrainingBatchRequest pull;
  pull.set_member_id(member);
  pull.set_max_tokens(static_cast<uint64_t>(config_.batch_max_tokens));
  pull.set_max_groups(static_cast<uint32_t>(config_.batch_max_groups));
  pull.set_trainer_policy_version(grpo_->policy_version());
  pull.set_wait_ms(config_.pull_wait_ms);
  tandem::v1::PullTrainingBatchResponse batch;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        absl::Now() + absl::Milliseconds(config_.pull_wait_ms) +
        absl::Seconds(5)));
    RETURN_IF_ERROR(rpc::ToAbslStatus(
        member_->session().stub()->PullTrainingBatch(&context, pull, &batch)));
  }
  if (batch.batch_id().empty() || batch.groups_size() == 0) {
    return absl::OkStatus();
  }
  ConvertedBatch converted = ConvertTrainingBatch(
      batch, grpo_->policy().weights()->config().vocab_size);
  for (const std::string& reason : converted.refused) {
    metrics_.step.RecordRefusedGroup();
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
  ASSIGN_OR_RETURN(GrpoStepStats stats, grpo_->Step(groups));
  if (stats.skipped()) {
    // Nothing was trained: no version to publish and no batch to commit.
    // The batch goes back at once (its groups are handed out again, or
    // dropped as stale).
    metrics_.step.RecordNonFinite(stats);
    Log()->warn(
        "optimizer step {} skipped: its {} is not finite (loss {}, grad norm "
        "{}); batch {} ({} groups) not trained and not committed; policy "
        "version stays {}",
        grpo_->step() + 1, stats.nonfinite, stats.loss.loss, stats.grad_norm,
        batch.batch_id(), groups.size(), stats.policy_version);
    ReleaseBatch(batch.batch_id(),
                 absl::StrCat("optimizer step skipped: its ", stats.nonfinite,
                              " is not finite"));
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
    stats.policy_version = grpo_->policy_version();
  }
  unacknowledged_step_ = false;
  metrics_.RecordStep(stats);
  Log()->info(
      "version {}: batch {}, {} groups ({} uniform, {} of them dropped, {} "
      "guided), {} tokens ({} completions with zero advantage not forwarded), reward "
      "{:.3f}, loss {:.4f}, clip {:.3f}, kl {:.4g}, grad norm {:.3f}, "
      "lr {:.3g}, {:.2f}s",
      stats.policy_version, batch.batch_id(), groups.size(),
      stats.uniform_groups, stats.dropped_uniform_groups, stats.guided_groups,
      stats.trained_tokens,
      stats.skipped_sequences, stats.reward_mean, stats.loss.loss,
      stats.loss.clip_fraction, stats.loss.kl_mean, stats.grad_norm, stats.lr,
      stats.step_seconds);
  status_.Update([&](tandem::v1::TrainerStatus& s) {
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
  return absl::OkStatus();
}

void Trainer::PoisonRewardsForTest(std::vector<ScoredPromptGroup>* groups) {
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

void Trainer::ReleaseBatch(const std::string& batch_id,
                           const std::string& reason) {
  tandem::v1::ReleaseTrainingBatchRequest request;
  request.set_member_id(member_->session().member_id());
  request.set_batch_id(batch_id);
  request.set_reason(reason);
  tandem::v1::ReleaseTrainingBatchResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::Status status = member_->session().stub()->ReleaseTrainingBatch(
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

void Trainer::MaybeEvaluate(bool initial) {
  if (evaluator_ == nullptr) return;
  const uint64_t version = grpo_->policy_version();
  if (!initial && !evaluator_->Due(version)) return;
  if (static_cast<int64_t>(version) == last_evaluated_version_) return;
  last_evaluated_version_ = static_cast<int64_t>(version);
  absl::StatusOr<HeldoutResult> result =
      evaluator_->Evaluate(grpo_->policy(), version);
  if (!result.ok()) {
    Log()->warn("held-out evaluation of version {} failed: {}", version,
                result.status().ToString());
    return;
  }
  metrics_.RecordHeldout(result->accuracy(), version);
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
  std::optional<BestPolicy> best;
  if (best_policy_ != nullptr) {
    absl::StatusOr<std::optional<BestPolicy>> offered =
        absl::FailedPreconditionError("no weights");
    absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights =
        grpo_->SnapshotWeights();
    if (weights.ok()) {
      offered = best_policy_->Offer(**weights, *result, grpo_->step());
    } else {
      offered = weights.status();
    }
    if (!offered.ok()) {
      Log()->warn("keeping the best policy (version {}) failed: {}", version,
                  offered.status().ToString());
    } else if (offered->has_value()) {
      Log()->info("best policy so far: version {} ({:.3f}), kept at {}",
                  version, (*offered)->accuracy, (*offered)->path);
    }
    best = best_policy_->best();
  }
  status_.Update([&](tandem::v1::TrainerStatus& s) {
    s.set_heldout_smoothed_accuracy(smoothed);
    s.set_heldout_smoothed_window(
        static_cast<uint32_t>(recent_heldout_.size()));
    if (best.has_value()) {
      s.set_heldout_best_accuracy(best->accuracy);
      s.set_heldout_best_policy_version(best->policy_version);
      s.set_heldout_best_path(
          (std::filesystem::path(config_.checkpoint_dir) / kBestPolicyLink)
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

void Trainer::TrainingLoop() {
  MaybeEvaluate(/*initial=*/true);
  while (!stopping_) {
    if (!ReconcileVersionOnce()) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    ServeCheckpointRequests();
    absl::Status status = TrainOnce();
    if (status.ok()) status = MaybeCheckpoint();
    if (status.ok()) MaybeEvaluate(/*initial=*/false);
    if (!status.ok() && !stopping_) {
      Log()->warn("training step failed: {}", status.ToString());
      absl::SleepFor(absl::Seconds(1));
    }
  }
}

void Trainer::RecordCheckpoint(const WrittenCheckpoint& written) {
  status_.Update([&](tandem::v1::TrainerStatus& s) {
    s.set_last_checkpoint(written.path);
  });
}

absl::Status Trainer::MaybeCheckpoint() {
  ASSIGN_OR_RETURN(std::optional<WrittenCheckpoint> written,
                   checkpoints_->MaybeSave(*grpo_));
  if (written) RecordCheckpoint(*written);
  return absl::OkStatus();
}

void Trainer::ServeCheckpointRequests() {
  std::vector<CheckpointRequestQueue::Request> requests =
      checkpoint_requests_.TakeAll();
  if (requests.empty()) return;
  absl::StatusOr<WrittenCheckpoint> written = absl::UnavailableError(
      absl::StrCat("version ", grpo_->policy_version(),
                   " was never acknowledged by the coordinator: not "
                   "checkpointing it"));
  if (!unacknowledged_step_) {
    written = checkpoints_->Save(*grpo_, "requested by the SaveCheckpoint RPC");
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

void Trainer::GracefulStop(absl::Duration deadline) {
  const absl::Time end = absl::Now() + deadline;
  stopping_ = true;
  member_->MarkNotServing();
  // The training thread ends its step (a publish under retry gives up at
  // once); what is left of the deadline is the broadcast's drain, less
  // the checkpoint and the gRPC shutdown after it.
  if (training_thread_.joinable()) training_thread_.join();
  StopWithin(std::max(absl::ZeroDuration(), end - absl::Now() - kStopReserve));
}

void Trainer::Stop() { StopWithin(absl::ZeroDuration()); }

void Trainer::StopWithin(absl::Duration broadcast_drain) {
  stopping_ = true;
  if (stopped_.exchange(true)) return;
  if (training_thread_.joinable()) training_thread_.join();
  // A broadcast under way gets `broadcast_drain` to finish, then is
  // aborted (its collective interrupted, its receivers reset); the
  // publisher joins its threads, so nothing calls back into the trainer
  // after this.
  if (publisher_) publisher_->Stop(broadcast_drain);
  if (grpo_ != nullptr && checkpoints_ != nullptr) {
    // The training thread has stopped: checkpoint what it trained, then
    // answer SaveCheckpoint calls that arrived meanwhile.
    checkpoint_requests_.SetAccepting(false);
    absl::StatusOr<std::optional<WrittenCheckpoint>> written =
        std::optional<WrittenCheckpoint>();
    if (unacknowledged_step_) {
      // The coordinator may or may not have recorded that version; the
      // checkpoint before it is the last one both sides agree on.
      Log()->warn(
          "not checkpointing on stop: version {} was never acknowledged by "
          "the coordinator",
          grpo_->policy_version());
    } else {
      written = checkpoints_->SaveOnStop(*grpo_);
    }
    if (!written.ok()) {
      Log()->error("checkpoint on stop failed: {}",
                   written.status().ToString());
    } else if (*written) {
      RecordCheckpoint(**written);
    }
    ServeCheckpointRequests();
  }
  // Answer held GetManifest long polls now: the gRPC shutdown below waits
  // for calls in flight.
  if (weight_server_) weight_server_->Shutdown();
  if (member_) member_->Shutdown(absl::Seconds(2));
}

}  // namespace tandem::trainer
