#include "services/coordinator/coordinator.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/cluster/cluster_watcher.h"
#include "common/rpc/grpc_client.h"
#include "prometheus/text_serializer.h"
#include "services/coordinator/request_limits.h"
#include "services/coordinator/rpc_replies.h"
#include "services/coordinator/sample_validation.h"

namespace tandem::coordinator {
namespace {

auto Log() { return ComponentLogger("coordinator"); }

using internal::Draining;
using internal::Finish;
using internal::Invalid;

GroupLedgerOptions LedgerOptions(const CoordinatorConfig& config,
                                 const PromptSource& source,
                                 absl::Time started) {
  GroupLedgerOptions options;
  options.group_size = static_cast<uint32_t>(config.group_size);
  options.max_lag = static_cast<uint32_t>(config.max_lag);
  options.lease_timeout = absl::Milliseconds(config.lease_timeout_ms);
  options.batch_timeout = absl::Milliseconds(config.training.batch_timeout_ms);
  options.keep_stale = config.training.stale_groups == "keep";
  options.groups_per_version =
      static_cast<uint64_t>(config.training.groups_per_version);
  tandem::v1::SamplingParams& sampling = options.sampling;
  sampling.set_temperature(static_cast<float>(config.sampling.temperature));
  sampling.set_top_p(static_cast<float>(config.sampling.top_p));
  sampling.set_top_k(static_cast<int32_t>(config.sampling.top_k));
  sampling.set_max_tokens(config.sampling.max_tokens > 0
                              ? static_cast<int32_t>(config.sampling.max_tokens)
                              : source.default_max_tokens());
  for (int32_t id : source.stop_token_ids()) sampling.add_stop_token_ids(id);
  // Ids of this incarnation start with its start time, so ids never repeat
  // across restarts.
  options.id_prefix = absl::StrCat("c", absl::Hex(absl::ToUnixMillis(started)));
  return options;
}

}  // namespace

grpc::Status Coordinator::CheckLimits(
    const char* rpc, const google::protobuf::Message& request) {
  absl::Status status = CheckRequestLimits(request);
  if (status.ok()) return grpc::Status::OK;
  metrics_.CountOversizedRequest(rpc);
  Log()->warn("refused {}: {}", rpc, std::string(status.message()));
  return rpc::ToGrpcStatus(status);
}

Coordinator::Coordinator(const CoordinatorConfig& config, Clock* clock)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      members_(absl::Milliseconds(config.heartbeat_timeout_ms),
               NewIncarnationTag()),
      verifier_client_(config.server.tls),
      clock_(clock),
      started_(clock->Now()) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorConfig& config, Clock* clock) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Coordinator> coordinator(new Coordinator(config, clock));
  Coordinator* self = coordinator.get();
  self->RotateDataPlaneSecret("start");
  ASSIGN_OR_RETURN(std::unique_ptr<PromptSource> source,
                   NewPromptSource(config.dataset));
  GroupLedgerOptions ledger_options =
      LedgerOptions(config, *source, self->started_);
  self->ledger_ =
      std::make_unique<GroupLedger>(ledger_options, std::move(source));
  ScoringDispatcherOptions scoring;
  scoring.batch_size = static_cast<uint32_t>(config.scoring.batch_size);
  scoring.batch_wait = absl::Milliseconds(config.scoring.batch_wait_ms);
  scoring.timeout = absl::Milliseconds(config.scoring.timeout_ms);
  scoring.concurrency = static_cast<uint32_t>(config.scoring.concurrency);
  scoring.retry_backoff = absl::Milliseconds(config.scoring.retry_backoff_ms);
  scoring.unroutable_timeout =
      absl::Milliseconds(config.scoring.unroutable_timeout_ms);
  scoring.clock = clock;
  // Before the scoring dispatcher: its callback posts to it.
  self->sync_pool_ = std::make_unique<boost::asio::thread_pool>(1);
  self->scoring_ = std::make_unique<ScoringDispatcher>(
      scoring, &self->verifier_client_,
      [self] {
        std::vector<VerifierReplica> replicas;
        for (auto& member : self->members_.ServingVerifiers()) {
          replicas.push_back(
              {std::move(member.address), std::move(member.verifiers)});
        }
        return replicas;
      },
      [self](const ScoringTask& task, const tandem::v1::Score& score) {
        if (self->ledger_->RecordScore(task.group_id, task.sample_index,
                                       score)) {
          self->PostServeParkedPulls();
        }
      });
  if (!config.journal.dir.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Journal> journal,
                     Journal::Open(config.journal.dir));
    const std::string path = journal->path();
    std::vector<ScoringTask> to_score;
    RETURN_IF_ERROR(
        self->ledger_->Recover(std::move(journal), clock->Now(), &to_score));
    const LedgerStats stats = self->ledger_->Stats();
    Log()->info(
        "journal {}: policy version {}, dataset cursor {}, {} pending, {} "
        "leased, {} samples to score, {} ready groups, {} groups trained",
        path, stats.policy_version, stats.dataset_cursor, stats.pending_prompts,
        stats.leased_prompts, to_score.size(),
        stats.ready_groups + stats.training_groups, stats.groups_trained);
    self->scoring_->Enqueue(std::move(to_score));
  }
  BroadcastEpochsOptions epochs;
  epochs.enabled = config.weight_sync.broadcast;
  epochs.backend = config.weight_sync.backend;
  epochs.report_timeout =
      absl::Milliseconds(config.weight_sync.report_timeout_ms);
  epochs.regroup_wait = absl::Milliseconds(config.weight_sync.regroup_wait_ms);
  // Unique per incarnation, so key prefixes never repeat across restarts:
  // real time (an identifier, not a deadline; a fake clock repeats).
  epochs.key_prefix_base = absl::StrCat(
      "tandem/weights/c", absl::Hex(absl::ToUnixMillis(absl::Now())));
  self->epochs_ = std::make_unique<BroadcastEpochs>(epochs);
  self->weight_sync_gauges_ =
      std::make_unique<WeightSyncGauges>(*self->registry_);
  self->watchers_ =
      std::make_unique<ClusterWatchers>(&self->metrics_.cluster_watchers());
  {
    // Snapshot for the first watchers: what the journal recovered.
    tandem::v1::ClusterEvent event;
    tandem::v1::PolicyVersionEvent* version = event.mutable_policy_version();
    self->ledger_->LatestVersion(version->mutable_manifest(),
                                 version->mutable_weight_server_address());
    if (version->manifest().policy_version() > 0) {
      self->watchers_->Publish(event);
    }
  }
  ASSIGN_OR_RETURN(self->runtime_,
                   daemon::DaemonRuntime::Create("coordinator", config.server,
                                                 self->registry_, {self}));
  Log()->info("prompt source: {}; group_size {}, max_lag {}",
              self->ledger_->DescribeSource(), config.group_size,
              config.max_lag);
  return coordinator;
}

Coordinator::~Coordinator() { Stop(); }

std::string Coordinator::MetricsTextForTest() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

absl::Status Coordinator::Start() {
  scoring_->Start();
  maintenance_thread_ = std::thread([this] { MaintenanceLoop(); });
  return runtime_->MarkReady();
}

void Coordinator::MaintenanceLoop() {
  const absl::Duration period =
      std::clamp(absl::Milliseconds(config_.heartbeat_interval_ms) / 4,
                 absl::Milliseconds(10), absl::Milliseconds(100));
  while (true) {
    {
      absl::MutexLock lock(&maintenance_mu_);
      if (clock_->AwaitWithTimeout(
              &maintenance_mu_, absl::Condition(&stop_maintenance_), period)) {
        return;
      }
    }
    const absl::Time now = clock_->Now();
    for (const auto& member : members_.ExpireSilent(now)) {
      const uint32_t returned = ledger_->ReleaseMember(member.member_id());
      Log()->warn(
          "member {} ({} at {}, pid {}) missed heartbeats for {} ms; declared "
          "dead; {} leases back in the queue",
          member.member_id(), RoleName(member.role()), member.grpc_address(),
          member.pid(), config_.heartbeat_timeout_ms, returned);
      metrics_.CountExpired(member.role());
      epochs_->RemoveMember(member.member_id());
      RotateDataPlaneSecret(member.member_id() + " was declared dead");
      ++members_expired_;
    }
    members_.Prune(now, absl::Milliseconds(config_.member_retention_ms));
    if (uint32_t n = ledger_->ExpireLeases(now); n > 0) {
      Log()->warn("{} prompt leases expired; their prompts are queued again",
                  n);
    }
    // A batch whose trainer member died or left returns at once. Holders
    // this incarnation never saw (a restart) get a grace period to come
    // back; a late publish of a released batch still commits it.
    if (now - started_ >=
        2 * absl::Milliseconds(config_.heartbeat_timeout_ms)) {
      if (uint32_t n = ledger_->ReleaseBatches(
              [this](const std::string& id) { return !members_.IsLive(id); });
          n > 0) {
        Log()->warn(
            "{} training batches released: the trainer holding them died or "
            "left; their groups are ready again",
            n);
      }
    }
    if (uint32_t n = ledger_->ExpireBatches(now); n > 0) {
      Log()->warn(
          "{} training batches were not committed in time; their "
          "groups are ready again",
          n);
    }
    PostServeParkedPulls();
    if (absl::Status s = ledger_->FlushJournal(); !s.ok()) {
      Log()->error("{}", s.ToString());
    }
    if (absl::Status s =
            ledger_->MaybeCompactJournal(config_.journal.compact_bytes);
        !s.ok()) {
      Log()->error("journal compaction failed: {}", s.ToString());
    }
    UpdateMemberGauges();
    UpdateWorkMetrics();
    Regroup(now);
    weight_sync_gauges_->Update(epochs_->Stats());
  }
}

void Coordinator::Regroup(absl::Time now) {
  const uint64_t failed = epochs_->Current().epoch();
  std::optional<tandem::v1::BroadcastGroup> group = epochs_->Regroup(now);
  if (!group) return;
  AnnounceEpoch(*group);
  Log()->info(
      "weight broadcast epoch {} re-sends version {} after epoch {} failed: "
      "{} receivers ({})",
      group->epoch(), group->first_policy_version(), failed,
      group->member_ids_size() - 1, absl::StrJoin(group->member_ids(), ", "));
}

void Coordinator::AnnounceEpoch(const tandem::v1::BroadcastGroup& group) {
  if (group.epoch() == 0) return;
  tandem::v1::ClusterEvent event;
  *event.mutable_membership_epoch()->mutable_group() = group;
  watchers_->Publish(event);
}

void Coordinator::UpdateMemberGauges() {
  std::map<std::pair<int, int>, int> counts;
  for (const auto& member : members_.Snapshot()) {
    ++counts[{member.role(), member.state()}];
  }
  for (auto role : {tandem::v1::ROLE_ROLLOUT, tandem::v1::ROLE_VERIFIER,
                    tandem::v1::ROLE_TRAINER}) {
    for (auto state :
         {tandem::v1::MEMBER_STATE_ALIVE, tandem::v1::MEMBER_STATE_DRAINING,
          tandem::v1::MEMBER_STATE_DEAD, tandem::v1::MEMBER_STATE_LEFT}) {
      metrics_.SetMembers(role, state, counts[{role, state}]);
    }
  }
}

void Coordinator::UpdateWorkMetrics() {
  metrics_.Update(ledger_->Stats(), scoring_->Stats());
}

grpc::ServerUnaryReactor* Coordinator::Register(
    grpc::CallbackServerContext* context,
    const tandem::v1::RegisterRequest* request,
    tandem::v1::RegisterResponse* response) {
  std::string owner;
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kRegister, *context, "", *request, &owner,
                request->role());
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (draining_) return Finish(context, Draining());
  if (request->role() == tandem::v1::ROLE_UNSPECIFIED) {
    return Finish(context,
                  Invalid("role must be set (rollout, verifier, trainer)"));
  }
  tandem::v1::MemberInfo info =
      members_.Register(*request, clock_->Now(), owner);
  metrics_.CountRegistration(info.role());
  UpdateMemberGauges();
  Log()->info("registered {} (gRPC {}, metrics {}, pid {}{})", info.member_id(),
              info.grpc_address(), info.metrics_address(), info.pid(),
              request->previous_member_id().empty()
                  ? ""
                  : ", previously " + request->previous_member_id());
  response->set_member_id(info.member_id());
  response->set_heartbeat_interval_ms(config_.heartbeat_interval_ms);
  response->set_heartbeat_timeout_ms(config_.heartbeat_timeout_ms);
  response->set_group_size(config_.group_size);
  response->set_max_lag(config_.max_lag);
  response->set_policy_version(ledger_->policy_version());
  tandem::v1::WeightManifest manifest;
  std::string weight_server_address;
  ledger_->LatestVersion(&manifest, &weight_server_address);
  if (manifest.policy_version() > 0) *response->mutable_manifest() = manifest;
  response->set_weight_server_address(weight_server_address);
  // A trainer that hosts a broadcast rendezvous store advertises it.
  if (info.role() == tandem::v1::ROLE_TRAINER) {
    auto store = request->capabilities().find("weight_broadcast_store");
    if (store != request->capabilities().end() && !store->second.empty()) {
      epochs_->SetTrainer(info.member_id(), store->second);
    }
  }
  response->set_membership_epoch(epochs_->Current().epoch());
  FillDataPlaneSecret(info.role(), response->mutable_data_plane());
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Coordinator::Heartbeat(
    grpc::CallbackServerContext* context,
    const tandem::v1::HeartbeatRequest* request,
    tandem::v1::HeartbeatResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kHeartbeat, *context, request->member_id(),
                *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  const absl::Time now = clock_->Now();
  absl::Status status = members_.Heartbeat(*request, now);
  if (status.ok()) {
    RenewResult renewed = ledger_->Renew(request->member_id(), {}, now);
    response->set_leases_renewed(renewed.renewed);
    response->set_lease_deadline_unix_ms(absl::ToUnixMillis(renewed.deadline));
    response->set_policy_version(ledger_->policy_version());
    response->set_membership_epoch(epochs_->Current().epoch());
    FillDataPlaneSecret(members_.RoleOf(request->member_id()),
                        response->mutable_data_plane());
  }
  return Finish(context, rpc::ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* Coordinator::Deregister(
    grpc::CallbackServerContext* context,
    const tandem::v1::DeregisterRequest* request,
    tandem::v1::DeregisterResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kDeregister, *context, request->member_id(),
                *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  absl::Status status = members_.Deregister(request->member_id());
  if (status.ok()) {
    const uint32_t returned = ledger_->ReleaseMember(request->member_id());
    response->set_leases_returned(returned);
    epochs_->RemoveMember(request->member_id());
    RotateDataPlaneSecret(request->member_id() + " deregistered");
    Log()->info("member {} left ({}); {} leases back in the queue",
                request->member_id(), request->reason(), returned);
    UpdateMemberGauges();
  }
  return Finish(context, rpc::ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* Coordinator::LeasePrompts(
    grpc::CallbackServerContext* context,
    const tandem::v1::LeasePromptsRequest* request,
    tandem::v1::LeasePromptsResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kLeasePrompts, *context, request->member_id(),
                *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (draining_) return Finish(context, Draining());
  if (request->max_prompts() == 0) {
    return Finish(context, Invalid("max_prompts must be > 0"));
  }
  if (!members_.IsLive(request->member_id())) {
    return Finish(context,
                  grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               absl::StrCat("member '", request->member_id(),
                                            "' is not registered or was "
                                            "declared dead; register again")));
  }
  const std::vector<std::string> excluded(
      request->exclude_environments().begin(),
      request->exclude_environments().end());
  *response = ledger_->Lease(request->member_id(), request->max_prompts(),
                             request->policy_version(), clock_->Now(),
                             excluded);
  if (response->leases_size() > 0) {
    const uint64_t version = ledger_->policy_version();
    metrics_.ObserveDispatchStaleness(version > request->policy_version()
                                          ? version - request->policy_version()
                                          : 0);
  }
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Coordinator::RenewLeases(
    grpc::CallbackServerContext* context,
    const tandem::v1::RenewLeasesRequest* request,
    tandem::v1::RenewLeasesResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kRenewLeases, *context, request->member_id(),
                *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (request->lease_ids_size() == 0) {
    return Finish(context, Invalid("lease_ids must not be empty"));
  }
  std::vector<std::string> ids(request->lease_ids().begin(),
                               request->lease_ids().end());
  RenewResult result = ledger_->Renew(request->member_id(), ids, clock_->Now());
  for (auto& id : result.unknown) response->add_unknown_lease_ids(id);
  response->set_deadline_unix_ms(absl::ToUnixMillis(result.deadline));
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Coordinator::ReturnLeases(
    grpc::CallbackServerContext* context,
    const tandem::v1::ReturnLeasesRequest* request,
    tandem::v1::ReturnLeasesResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kReturnLeases, *context, request->member_id(),
                *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  std::vector<std::string> ids(request->lease_ids().begin(),
                               request->lease_ids().end());
  const uint32_t returned = ledger_->Return(request->member_id(), ids);
  response->set_returned(returned);
  if (returned > 0) {
    Log()->info("member {} returned {} leases ({})", request->member_id(),
                returned, request->reason());
  }
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Coordinator::SubmitSamples(
    grpc::CallbackServerContext* context,
    const tandem::v1::SubmitSamplesRequest* request,
    tandem::v1::SubmitSamplesResponse* response) {
  if (grpc::Status auth = Authorize(CoordinatorRpc::kSubmitSamples, *context,
                                    request->member_id());
      !auth.ok()) {
    return Finish(context, auth);
  }
  // Every sample is checked before any is stored (sample_validation.h): a
  // refused call changes nothing.
  absl::Status valid = ValidateSubmitRequest(*request);
  absl::StatusOr<SubmitResult> result =
      valid.ok() ? ledger_->Submit(*request,
                                   members_.LeaseHolders(request->member_id()))
                 : absl::StatusOr<SubmitResult>(std::move(valid));
  if (!result.ok()) {
    const std::optional<SubmitRefusal> reason = RefusalOf(result.status());
    if (reason) {
      metrics_.CountSubmitRefusal(*reason);
      if (*reason == SubmitRefusal::kTooLarge) {
        metrics_.CountOversizedRequest("SubmitSamples");
      }
    }
    // The member id is within its limit unless the limit is what failed.
    const std::string& member = request->member_id();
    Log()->warn("refused SubmitSamples of {} sample(s) from '{}': {}",
                request->samples_size(),
                member.size() <= kMaxIdBytes ? member : "(oversized id)",
                std::string(result.status().message()));
    return Finish(context, rpc::ToGrpcStatus(result.status()));
  }
  *response = std::move(result->response);
  if (!result->to_score.empty()) scoring_->Enqueue(std::move(result->to_score));
  return Finish(context, grpc::Status::OK);
}

grpc::ServerWriteReactor<tandem::v1::ClusterEvent>* Coordinator::WatchCluster(
    grpc::CallbackServerContext* context,
    const tandem::v1::WatchClusterRequest* request) {
  if (grpc::Status auth = Authorize(CoordinatorRpc::kWatchCluster, *context,
                                    request->member_id());
      !auth.ok()) {
    return ClusterWatchers::Reject(auth);
  }
  if (draining_) return ClusterWatchers::Reject(Draining());
  if (grpc::Status limits = CheckLimits("WatchCluster", *request);
      !limits.ok()) {
    return ClusterWatchers::Reject(limits);
  }
  if (!request->member_id().empty() && !members_.IsLive(request->member_id())) {
    return ClusterWatchers::Reject(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("WatchCluster: member_id '", request->member_id(),
                     "' is not registered or was declared dead; register "
                     "again, or watch with an empty member_id as an "
                     "observer")));
  }
  context->AddInitialMetadata(cluster::kWatchOpenMetadata, "1");
  return watchers_->Open();
}

grpc::ServerUnaryReactor* Coordinator::SyncWeightGroup(
    grpc::CallbackServerContext* context,
    const tandem::v1::SyncWeightGroupRequest* request,
    tandem::v1::SyncWeightGroupResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kSyncWeightGroup, *context,
                request->member_id(), *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  metrics_.CountWeightGroupSync();
  if (!members_.IsLive(request->member_id())) {
    return Finish(context,
                  grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               absl::StrCat("member '", request->member_id(),
                                            "' is not registered or was "
                                            "declared dead; register again")));
  }
  if (request->failed_epoch() != 0) {
    Log()->warn("weight broadcast epoch {} failed at {}: {}",
                request->failed_epoch(), request->member_id(),
                request->failure());
  }
  epochs_->Report(*request, clock_->Now());
  Regroup(clock_->Now());
  tandem::v1::WeightManifest manifest;
  std::string weight_server_address;
  ledger_->LatestVersion(&manifest, &weight_server_address);
  response->set_policy_version(ledger_->policy_version());
  response->set_weight_server_address(weight_server_address);
  response->set_report_timeout_ms(
      static_cast<uint64_t>(config_.weight_sync.report_timeout_ms));
  *response->mutable_group() = epochs_->Current();
  return Finish(context, grpc::Status::OK);
}

void Coordinator::GracefulStop(absl::Duration deadline) {
  draining_ = true;
  runtime_->MarkNotServing();
  Log()->info("draining (deadline {})", absl::FormatDuration(deadline));
  ServeParkedPulls(/*finish_all=*/true);
  watchers_->Shutdown("coordinator is shutting down");
  runtime_->Shutdown(deadline);
  Stop();
}

void Coordinator::Stop() {
  if (stopped_.exchange(true)) return;
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&maintenance_mu_);
    stop_maintenance_ = true;
  }
  if (maintenance_thread_.joinable()) maintenance_thread_.join();
  if (scoring_) scoring_->Stop();
  if (runtime_) {
    ServeParkedPulls(/*finish_all=*/true);
    watchers_->Shutdown("coordinator stopped");
    runtime_->Shutdown(absl::ZeroDuration());
  }
  if (sync_pool_) sync_pool_->join();
  if (ledger_) {
    if (absl::Status s = ledger_->SyncJournal(); !s.ok()) {
      Log()->error("{}", s.ToString());
    }
  }
  Log()->info("stopped (background work and journal in {:.2f} s)",
              absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace tandem::coordinator
