#include "services/trainer/trainer.h"

#include <map>
#include <optional>

#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/cluster/coordinator_client.h"
#include "common/model/decoder_model.h"
#include "common/model/device.h"
#include "common/model/model_loader.h"
#include "common/model/model_weights.h"
#include "common/rpc/grpc_client.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/reference_policy.h"
#include "tandem/v1/coordinator.grpc.pb.h"

#if TANDEM_TRAINER_DEVICE_SYNC
#include <c10/cuda/CUDAFunctions.h>

#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/device_delta.h"
#endif

namespace tandem::trainer {
namespace {

auto Log() { return ComponentLogger("trainer"); }

// What GracefulStop keeps of its deadline for the work after the broadcast
// drain: the checkpoint on stop and the gRPC shutdown (member_->Shutdown).
constexpr absl::Duration kStopReserve = absl::Seconds(2);

// The coordinator's latest policy version (one short retried call, its
// budget and backoff on `clock`).
absl::StatusOr<uint64_t> CoordinatorPolicyVersion(const std::string& address,
                                                  const rpc::TlsOptions& tls,
                                                  Clock* clock) {
  std::unique_ptr<cluster::CoordinatorClient> coordinator =
      cluster::ConnectCoordinator(address, tls);
  rpc::RetryPolicy retry;
  retry.attempt_timeout = absl::Seconds(2);
  retry.total_timeout = absl::Seconds(5);
  retry.clock = clock;
  tandem::v1::GetClusterStatusResponse response;
  RETURN_IF_ERROR(rpc::CallWithRetry(
      "GetClusterStatus", retry, [&](grpc::ClientContext* context) {
        return coordinator->GetClusterStatus(
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
  o.logprobs.kernel = c.logprobs_kernel == "cuda" ? TokenLogProbsKernel::kCuda
                      : c.logprobs_kernel == "aten"
                          ? TokenLogProbsKernel::kAten
                          : TokenLogProbsKernel::kAuto;
  return o;
}

}  // namespace

Trainer::Trainer(const TrainerConfig& config, Clock* clock)
    : config_(config),
      clock_(clock),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      // With shared memory on, each FULL version is copied into its
      // /dev/shm segment when it is published (on the training thread), so
      // serving a same-host pull copies nothing (weight_store.h).
      store_(4, config.weight_shared_memory
                    ? weights::WeightStore::SharedMemory::kAtPut
                    : weights::WeightStore::SharedMemory::kOnRequest) {}

absl::StatusOr<GrpoStepStats> Trainer::TrainAndStoreForTest(
    const std::vector<ScoredPromptGroup>& groups,
    weights::PublishedVersion* published) {
  return loop_->StepAndStoreForTest(groups, published);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerConfig& config, Clock* clock) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Trainer> trainer(new Trainer(config, clock));
  ASSIGN_OR_RETURN(const model::WeightDType publish_dtype,
                   trainer->CreatePolicy());
  RETURN_IF_ERROR(trainer->CreateWeightServing());
  RETURN_IF_ERROR(trainer->CreateMember());
  cluster::MemberDaemon* member = trainer->member_.get();
  ASSIGN_OR_RETURN(
      trainer->loop_,
      TrainingLoop::Create(TrainingLoopParts{
          .config = &trainer->config_,
          .grpo = trainer->grpo_.get(),
          .checkpoints = trainer->checkpoints_.get(),
          .resumed = trainer->resumed_,
          .publish_dtype = publish_dtype,
          .store = &trainer->store_,
          .device_ring = trainer->device_ring_.get(),
          // Used by the device broadcast and by device delta detection.
          .device_copies = trainer->device_sync_ &&
                           (trainer->config_.weight_broadcast ||
                            publish_dtype == model::WeightDType::kBFloat16),
          .change_compactor = trainer->change_compactor_.get(),
          .weight_sync_metrics = trainer->weight_sync_metrics_.get(),
          .publisher = trainer->publisher_.get(),
          .metrics = &trainer->metrics_,
          .status = &trainer->status_,
          .checkpoint_requests = &trainer->checkpoint_requests_,
          .coordinator = &member->session(),
          .weight_server_address = [member] { return member->grpc_address(); },
          .clock = clock,
      }));
  return trainer;
}

absl::StatusOr<model::WeightDType> Trainer::CreatePolicy() {
  const TrainerConfig& config = config_;
  checkpoints_ = std::make_unique<CheckpointManager>(ToCheckpointPolicy(config),
                                                     registry_.get());
  // A checkpoint to resume from replaces the initial policy: its hf/ is a
  // Hugging Face directory with the fp32 master weights.
  ASSIGN_OR_RETURN(std::optional<LoadedCheckpoint> resumed,
                   checkpoints_->FindResumePoint([&config, this] {
                     return CoordinatorPolicyVersion(config.coordinator_address,
                                                     config.server.tls, clock_);
                   }));
  resumed_ = resumed.has_value();
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
#if TANDEM_TRAINER_DEVICE_SYNC
  if (device.cuda) {
    device_sync_ = true;
    cuda_index_ = device.index < 0 ? 0 : device.index;
    change_compactor_ = std::make_unique<weights::CudaChangeCompactor>();
  }
#endif
  if (device.cuda && config.weight_cuda_ipc_versions > 0) {
    device_ring_ = std::make_unique<weights::DeviceVersionRing>(
        static_cast<size_t>(config.weight_cuda_ipc_versions));
  }
  GrpoTrainerOptions options = ToOptions(config);
  options.compute_dtype =
      model::ResolveDType(requested, device, model::WeightDType::kFloat32);
  Log()->info("policy: {}; forward and backward in {}{}", model.description,
              std::string(model::WeightDTypeName(options.compute_dtype)),
              options.compute_dtype == model::WeightDType::kFloat32
                  ? ""
                  : " (mixed precision: float32 master weights and AdamW "
                    "state)");
  ASSIGN_OR_RETURN(grpo_,
                   GrpoTrainer::Create(*model.decoder->weights(), 0, options));
  RETURN_IF_ERROR(SetReferencePolicy(model.decoder->weights()->config()));
  if (resumed) {
    RETURN_IF_ERROR(checkpoints_->Restore(*resumed, grpo_.get()));
    status_.Update([&](tandem::v1::TrainerStatus& s) {
      s.set_step(static_cast<uint64_t>(grpo_->step()));
      s.set_policy_version(grpo_->policy_version());
      s.set_last_checkpoint(resumed->path);
    });
    metrics_.policy_version.Set(static_cast<double>(grpo_->policy_version()));
  }
  // Rollout workers load model.path in its own dtype (e.g. bfloat16) and
  // receive versions in that layout; the trainer keeps fp32 master weights
  // (and a resumed checkpoint stores them), so it publishes converted.
  model::WeightDType publish_dtype = model.stored_dtype;
  if (resumed && !config.model_path.empty()) {
    ASSIGN_OR_RETURN(model::ModelConfig original,
                     model::ReadModelConfig(config.model_path));
    publish_dtype = original.dtype;
  }
  return publish_dtype;
}

absl::Status Trainer::SetReferencePolicy(const model::ModelConfig& policy) {
  const TrainerConfig& config = config_;
  // The KL reference is the starting policy (or training.reference_model),
  // also when the trained policy resumes from a checkpoint.
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> reference,
                   LoadReferencePolicy(config, policy));
  if (reference == nullptr && !config.reference_model.empty()) {
    Log()->warn(
        "training.reference_model {} is not loaded: training.kl_beta "
        "is 0",
        config.reference_model);
  }
  if (reference != nullptr) {
    RETURN_IF_ERROR(grpo_->SetReferencePolicy(*reference));
    Log()->info("KL penalty {} to the frozen reference policy {}",
                config.kl_beta,
                config.reference_model.empty()
                    ? (config.model_path.empty() ? "(built-in initial model)"
                                                 : config.model_path)
                    : config.reference_model);
  }
  return absl::OkStatus();
}

absl::Status Trainer::CreateWeightServing() {
  const TrainerConfig& config = config_;
  weight_sync_metrics_ =
      std::make_unique<weights::WeightSyncMetrics>(*registry_);
  if (config.server.tls.enabled()) {
    data_plane_key_ = std::make_shared<weights::DataPlaneKeyHolder>();
  }
  weight_server_ = std::make_unique<weights::WeightServerService>(
      &store_,
      weights::WeightServerOptions{
          .metrics = weight_sync_metrics_.get(),
          // Where the gRPC server listens, so a worker that reached gRPC
          // (another host, a container) reaches the data port too.
          .data_host = config::HostOfAddress(config.server.grpc_address),
          .data_port = static_cast<uint16_t>(config.weight_data_port),
          .shared_memory = config.weight_shared_memory,
          .cuda_ipc = device_ring_.get(),
          .max_data_connections =
              static_cast<int>(config.weight_data_max_connections),
          .data_stream_threads = static_cast<int>(config.weight_data_threads),
          .data_request_timeout =
              absl::Milliseconds(config.weight_data_request_timeout_ms),
          .data_send_timeout =
              absl::Milliseconds(config.weight_data_send_timeout_ms),
          .tls_enabled = config.server.tls.enabled(),
          .auth_refused = &metrics_.auth_refused,
          // Under mTLS the raw data port admits only holders of the
          // coordinator's current data-plane secret.
          .data_plane_key = data_plane_key_,
          .clock = clock_});
  if (config.weight_broadcast) {
    weights::BroadcastSenderOptions broadcast;
    broadcast.store_host =
        config.weight_store_host.empty()
            ? config::ReachableHostOf(config.server.grpc_address)
            : config.weight_store_host;
    broadcast.store_port = static_cast<uint16_t>(config.weight_store_port);
    broadcast.bind_host = broadcast.store_host;
    broadcast.timeout = absl::Milliseconds(config.weight_broadcast_timeout_ms);
    if (config.server.tls.enabled()) {
      // Under mTLS the groups rendezvous through the trainer's gRPC server
      // (certificates checked, trainer and rollout roles only): no TCPStore
      // and no store port, whose protocol has no credential at all.
      // weight_sync.store_port is not used then.
      broadcast.rendezvous_keys = std::make_shared<weights::RendezvousKeys>();
      // And every version crosses the pair sockets sealed with the
      // data-plane key (docs/operations.md, "Sealed weight data").
      broadcast.data_plane_key = data_plane_key_;
      rendezvous_service_ = std::make_unique<RendezvousService>(
          broadcast.rendezvous_keys, /*tls_enabled=*/true,
          &metrics_.auth_refused);
    }
#if TANDEM_TRAINER_DEVICE_SYNC
    // FULL versions with a device copy (device_sync_) go from it when the
    // group is NCCL and nothing is sealed (broadcast_sender.h).
    broadcast.device_publish = [](weights::BroadcastGroup* group,
                                  const tandem::v1::WeightManifest& manifest,
                                  const uint8_t* d_payload, uint64_t bytes) {
      return weights::PublishDeviceOverBroadcast(group, manifest, d_payload,
                                                 bytes);
    };
    // The sender's NCCL groups run on the weights' device (the device copy
    // lies there).
    if (device_sync_) {
      broadcast.on_thread_start = [index = cuda_index_] {
        c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
      };
    }
#endif
    ASSIGN_OR_RETURN(publisher_, WeightPublisher::Create(
                                     broadcast, &store_,
                                     weight_sync_metrics_.get(), clock_));
    Log()->info("weight broadcast rendezvous store on {}",
                rendezvous_service_ != nullptr
                    ? std::string("the trainer's gRPC server (mTLS)")
                    : publisher_->store_address());
  }
  return absl::OkStatus();
}

absl::Status Trainer::CreateMember() {
  const TrainerConfig& config = config_;
  std::map<std::string, std::string> capabilities;
  if (publisher_) {
    capabilities["weight_broadcast_store"] = publisher_->store_address();
  }
  service_ = std::make_unique<TrainerService>(
      &status_, &checkpoint_requests_, config.train,
      [this] {
        return member_ != nullptr ? member_->session().member_id()
                                  : std::string();
      },
      config.server.tls.enabled(), &metrics_.auth_refused);
  std::vector<grpc::Service*> services = {service_.get(),
                                          weight_server_.get()};
  if (rendezvous_service_ != nullptr) {
    services.push_back(rendezvous_service_.get());
  }
  ASSIGN_OR_RETURN(
      member_, cluster::MemberDaemon::Create(
                   "trainer", tandem::v1::ROLE_TRAINER, config.server,
                   config.coordinator_address, registry_, services,
                   [this](tandem::v1::HeartbeatRequest* r) {
                     r->set_policy_version(grpo_->policy_version());
                     if (stopping_) {
                       r->set_state(tandem::v1::MEMBER_STATE_DRAINING);
                     }
                   },
                   std::move(capabilities),
                   data_plane_key_ == nullptr ? nullptr
                                              : weights::DataPlaneSecretSink(
                                                    data_plane_key_, "trainer"),
                   clock_));
  return absl::OkStatus();
}

Trainer::~Trainer() { Stop(); }

absl::Status Trainer::Start() {
  if (publisher_) {
    cluster::MemberSession* session = &member_->session();
    publisher_->Start(WeightPublisher::Coordinator{
        .client = session->client(),
        .member_id = [session] { return session->member_id(); }});
  }
  RETURN_IF_ERROR(member_->Start());
  if (config_.train) loop_->Start();
  return absl::OkStatus();
}

void Trainer::GracefulStop(absl::Duration deadline) {
  const absl::Time end = absl::Now() + deadline;
  stopping_ = true;
  member_->MarkNotServing();
  // The training loop ends its step (a publish under retry gives up at
  // once); what is left of the deadline is the broadcast's drain, less
  // the checkpoint and the gRPC shutdown after it.
  if (loop_) loop_->Stop();
  StopWithin(std::max(absl::ZeroDuration(), end - absl::Now() - kStopReserve));
}

void Trainer::Stop() { StopWithin(absl::ZeroDuration()); }

void Trainer::StopWithin(absl::Duration broadcast_drain) {
  stopping_ = true;
  if (stopped_.exchange(true)) return;
  if (loop_) loop_->Stop();
  // A broadcast under way gets `broadcast_drain` to finish, then is
  // aborted (its collective interrupted, its receivers reset); the
  // publisher joins its threads, so nothing calls back into the trainer
  // after this.
  if (publisher_) publisher_->Stop(broadcast_drain);
  // The training loop has stopped: it checkpoints what it trained and
  // answers the SaveCheckpoint calls still queued.
  if (loop_) loop_->FinishOnStop();
  // Answer held GetManifest long polls now: the gRPC shutdown below waits
  // for calls in flight.
  if (weight_server_) weight_server_->Shutdown();
  if (rendezvous_service_) rendezvous_service_->Shutdown();
  if (member_) member_->Shutdown(absl::Seconds(2));
}

}  // namespace tandem::trainer
