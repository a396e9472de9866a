#include "services/rollout/rollout_worker.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/config/daemon_flags.h"
#include "common/model/device.h"
#include "common/model/paged_attention.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

// How long a worker leases nothing after refusing a lease (an episode
// without environment.address, a prompt too long for its context).
constexpr absl::Duration kRefusedLeaseBackoff = absl::Seconds(1);

tandem::v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return tandem::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kAborted:
      return tandem::v1::FINISH_REASON_ABORTED;
    default:
      return tandem::v1::FINISH_REASON_UNSPECIFIED;
  }
}

engine::EngineOptions ToEngineOptions(const RolloutConfig& config,
                                      std::vector<int32_t> eos) {
  engine::EngineOptions o;
  o.limits.max_num_seqs = static_cast<int32_t>(config.max_num_seqs);
  o.limits.max_batched_tokens = static_cast<int32_t>(config.max_batched_tokens);
  o.num_kv_blocks = static_cast<int32_t>(config.num_kv_blocks);
  o.block_size = static_cast<int32_t>(config.block_size);
  o.static_batching = config.batching == "static";
  o.update_policy = config.update_policy == "drain"
                        ? engine::EngineOptions::UpdatePolicy::kDrain
                        : engine::EngineOptions::UpdatePolicy::kInflight;
  o.kv_policy = config.kv_policy == "recompute"
                    ? engine::EngineOptions::KvPolicy::kRecompute
                    : engine::EngineOptions::KvPolicy::kKeep;
  o.eos_token_ids = std::move(eos);
  return o;
}

}  // namespace

RolloutWorker::RolloutWorker(const RolloutConfig& config, Clock* clock)
    : config_(config),
      clock_(clock),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_) {}

absl::StatusOr<std::unique_ptr<RolloutWorker>> RolloutWorker::Create(
    const RolloutConfig& config, Clock* clock) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<RolloutWorker> w(new RolloutWorker(config, clock));
  if (!config.model_path.empty() &&
      !std::filesystem::exists(config.model_path + "/config.json")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_path: no config.json in '", config.model_path, "'"));
  }
  RolloutWorker* self = w.get();
  if (config.server.tls.enabled()) {
    w->data_plane_key_ = std::make_shared<weights::DataPlaneKeyHolder>(clock);
  }
  ASSIGN_OR_RETURN(
      w->member_,
      cluster::MemberDaemon::Create(
          "rollout", tandem::v1::ROLE_ROLLOUT, config.server,
          config.coordinator_address, w->registry_, {self},
          [self](tandem::v1::HeartbeatRequest* r) { self->FillHeartbeat(r); },
          {{"max_num_seqs", std::to_string(config.max_num_seqs)}},
          w->data_plane_key_ == nullptr
              ? nullptr
              : weights::DataPlaneSecretSink(w->data_plane_key_, "rollout"),
          clock));
  cluster::MemberSession* session = &w->member_->session();
  auto member_id = [session] { return session->member_id(); };
  w->prefetcher_ = std::make_unique<PromptPrefetcher>(
      session->client(), member_id,
      [self] {
        absl::MutexLock lock(&self->mu_);
        return self->snapshot_.policy_version;
      },
      static_cast<int32_t>(config.prefetch_prompts), clock);
  w->submitter_ = std::make_unique<SampleSubmitter>(
      session->client(), member_id, /*max_batch=*/64,
      &w->metrics_.samples_refused, clock);
  w->weight_sync_metrics_ =
      std::make_unique<weights::WeightSyncMetrics>(*w->registry_);
  return w;
}

absl::Status RolloutWorker::LoadModelAndEngine() {
  // Aliases keep the statements as they were in Create.
  RolloutWorker* const w = this;
  RolloutWorker* const self = this;
  const RolloutConfig& config = config_;
  if (model_loader_) {
    ASSIGN_OR_RETURN(w->model_, model_loader_());
  } else {
    ASSIGN_OR_RETURN(
        w->model_,
        model::LoadModel(config.model_path, config.model_seed,
                         static_cast<int32_t>(config.torch_threads),
                         {.device = config.device, .dtype = config.dtype}));
  }
  Log()->info("model: {}", w->model_.description);
  engine::TorchEngineModelOptions model_options;
  model_options.kv_layout = config.kv_layout == "paged"
                                ? engine::KvLayout::kPaged
                            : config.kv_layout == "contiguous"
                                ? engine::KvLayout::kContiguous
                                : engine::KvLayout::kAuto;
  model_options.kv_blocks = config.num_kv_blocks;
  model_options.block_size = config.block_size;
  model_options.cuda_graphs = config.cuda_graphs;
  // The schema admits only the three names.
  model_options.paged_attention =
      model::ParsePagedAttention(config.paged_attention)
          .value_or(model::PagedAttention::kGather);
  w->engine_model_ = std::make_unique<engine::TorchEngineModel>(
      w->model_.decoder, w->model_.max_tokens, model_options);
  engine::WeightUpdateSource* source = nullptr;
  if (config.update_mode == "inplace") {
    // One copy of the weights: the model's tensors become views of the
    // buffer the transports receive into.
    ASSIGN_OR_RETURN(w->inplace_source_,
                     InplaceWeightSource::Create(w->model_.decoder, 0));
    source = w->inplace_source_.get();
    Log()->info(
        "update_mode inplace: one copy of the weights ({} bytes, "
        "flat buffer); the engine parks while a version is received",
        w->inplace_source_->staging()->layout().total_bytes());
  } else {
    w->weight_source_ = std::make_unique<StagedWeightSource>(w->model_.decoder);
    source = w->weight_source_.get();
  }
  w->engine_ = std::make_unique<engine::Engine>(
      ToEngineOptions(config, w->model_.eos_token_ids), w->engine_model_.get(),
      source, 0);
  cluster::MemberSession* session = &w->member_->session();
  auto member_id = [session] { return session->member_id(); };
  WeightSyncOptions sync;
  sync.mode = config.weight_sync == "pull"
                  ? WeightSyncOptions::Mode::kPull
                  : WeightSyncOptions::Mode::kBroadcast;
  sync.sync_weight_group = SyncWeightGroupVia(session->client());
  sync.member_id = member_id;
  sync.clock = clock_;
  sync.bind_host = config.weight_sync_bind_host.empty()
                       ? config::ReachableHostOf(config.server.grpc_address)
                       : config.weight_sync_bind_host;
  sync.timeout = absl::Milliseconds(config.weight_sync_timeout_ms);
  sync.metrics = w->weight_sync_metrics_.get();
  sync.watch_poll_interval =
      absl::Milliseconds(config.weight_sync_poll_interval_ms);
  sync.pull_shared_memory = config.weight_sync_shared_memory;
  // model.device was checked when the model loaded.
  const absl::StatusOr<model::DeviceName> device =
      model::ParseDeviceName("model.device", config.device);
  if (config.weight_sync_cuda_ipc && device.ok() && device->cuda) {
    absl::StatusOr<std::unique_ptr<weights::CudaIpcDeviceSink>> sink =
        weights::CudaIpcDeviceSink::Create(std::max(device->index, 0));
    if (sink.ok()) {
      w->cuda_ipc_sink_ = *std::move(sink);
      sync.pull_cuda_ipc = w->cuda_ipc_sink_.get();
    } else {
      Log()->warn("weight_sync.cuda_ipc: {}; pulling without CUDA IPC",
                  sink.status().ToString());
    }
  }
  sync.tls = config.server.tls;
  sync.data_plane_key = w->data_plane_key_;
  // The trainer publishes in the checkpoint's dtype; a worker computing in
  // another one (model.dtype) or on a GPU converts each version on the
  // receiver thread.
  sync.wire_dtype = w->model_.stored_dtype;
  if (sync.mode == WeightSyncOptions::Mode::kBroadcast &&
      config.weight_sync_watch) {
    w->watcher_ = std::make_unique<cluster::ClusterWatcher>(
        session->client(),
        cluster::ClusterWatcherOptions{.member_id = member_id,
                                       .clock = clock_});
    sync.watcher = w->watcher_.get();
  }
  if (w->inplace_source_) sync.inplace_staging = w->inplace_source_->staging();
  ASSIGN_OR_RETURN(
      w->subscriber_,
      WeightSubscriber::Create(w->model_.decoder, w->weight_source_.get(), 0,
                               std::move(sync)));
  return absl::OkStatus();
}

RolloutWorker::~RolloutWorker() { Stop(); }

absl::Status RolloutWorker::Start() {
  {
    absl::MutexLock lock(&mu_);
    rate_since_ = absl::Now();
  }
  loader_thread_ = std::thread([this] { LoadAndStart(); });
  return absl::OkStatus();
}

void RolloutWorker::LoadAndStart() {
  const absl::Time load_start = absl::Now();
  if (absl::Status status = LoadModelAndEngine(); !status.ok()) {
    Log()->critical("cannot load the model: {}; health stays NOT_SERVING",
                    status.ToString());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    state_ = tandem::v1::ROLLOUT_STATE_RUNNING;
  }
  loaded_ = true;
  Log()->info("model loaded in {}",
              absl::FormatDuration(absl::Now() - load_start));
  if (absl::Status status = StartOpenAIServer(); !status.ok()) {
    Log()->critical("cannot start the OpenAI endpoint: {}", status.ToString());
    return;
  }
  if (absl::Status status = StartEpisodes(); !status.ok()) {
    Log()->critical("cannot run episodes: {}", status.ToString());
    return;
  }
  if (absl::Status status = member_->Start(); !status.ok()) {
    Log()->critical("cannot start serving: {}", status.ToString());
    return;
  }
  prefetcher_->Start();
  submitter_->Start();
  if (watcher_) watcher_->Start();
  subscriber_->Start();
  generation_thread_ = std::thread([this] { GenerationLoop(); });
}

void RolloutWorker::AbortAllWork(const std::string& reason,
                                 const absl::Status& status) {
  std::vector<std::string> aborted = engine_->AbortAll();
  serving_.FailAdmitted(status);
  if (episodes_) {
    // The aborted episodes are closed at their environment; their leases
    // go back below with the others.
    for (engine::FinishedSample& f : engine_->TakeFinished()) {
      // Others are dropped as before: their leases go back below.
      if (!episodes_->OnFinished(f)) serving_.Dispatch(f);
    }
    episodes_->TakeFinished();
    // Tasks still waiting for their opens are not in the engine.
    for (std::string& id : episodes_->AbortUnstarted()) {
      aborted.push_back(std::move(id));
    }
  }
  // Harness groups that finished are submitted; the others end with their
  // leases (their turns in flight failed with the served requests).
  if (harness_) {
    DeliverHarness();
    for (std::string& id : harness_->AbortAll(reason)) {
      aborted.push_back(std::move(id));
    }
  }
  // Served requests are no leases: only the leases go back.
  aborted.erase(std::remove_if(aborted.begin(), aborted.end(),
                               [this](const std::string& id) {
                                 return leases_.count(id) == 0;
                               }),
                aborted.end());
  leases_.clear();
  prefetcher_->Return(aborted, reason);
}

void RolloutWorker::AdmitLeases() {
  const engine::EngineSnapshot snap = engine_->Snapshot();
  // Parked sequences (episodes waiting for their environment) take no
  // batch slot, so they do not keep new work out of the batch; but they
  // hold a lease and KV blocks, so at most environment.max_parked of them
  // come on top of the batch, and a worker does not take unbounded leases
  // while its episodes wait.
  const int64_t batch_room =
      config_.max_num_seqs - snap.running - snap.waiting;
  const int64_t held_room = config_.max_num_seqs +
                            config_.environment_max_parked - snap.running -
                            snap.waiting - snap.parked;
  const int32_t room =
      static_cast<int32_t>(std::min(batch_room, held_room));
  // Harness episodes wait for their harnesses, not for the engine: they
  // are bounded by openai.harness_max_episodes. At the bound the worker
  // takes and leases only the other tasks of a mixed dataset (the
  // coordinator keeps the harness tasks queued for a later lease).
  if (harness_) {
    prefetcher_->SetExcludedEnvironment(
        harness_->full() ? config_.openai_harness_environment : "");
  }
  if (room <= 0) return;
  // More work would take the blocks the parked episodes keep (they are
  // dropped first and recomputed on resume).
  if (snap.parked > 0 &&
      snap.kv_blocks_used >= config_.environment_park_kv_fraction *
                                 snap.kv_blocks_total) {
    return;
  }
  for (tandem::v1::PromptLease& lease :
       prefetcher_->Take(std::max(1, room / 4))) {
    engine::SamplingParams params;
    const auto& s = lease.sampling();
    params.temperature = s.temperature();
    params.top_p = s.top_p() > 0 ? s.top_p() : 1.0f;
    params.top_k = s.top_k();
    params.seed = s.seed();
    params.stop_token_ids.assign(s.stop_token_ids().begin(),
                                 s.stop_token_ids().end());
    params.n = static_cast<int32_t>(std::max<uint32_t>(1, lease.group_size()));
    const int64_t room_tokens =
        model_.max_tokens - lease.prompt_token_ids_size();
    params.max_tokens = static_cast<int32_t>(std::min<int64_t>(
        s.max_tokens() > 0 ? s.max_tokens() : room_tokens, room_tokens));
    std::vector<int32_t> prompt(lease.prompt_token_ids().begin(),
                                lease.prompt_token_ids().end());
    absl::Status status =
        params.max_tokens <= 0
            ? absl::InvalidArgumentError(absl::StrCat(
                  "prompt of ", lease.prompt_token_ids_size(),
                  " tokens leaves no room in a context of ", model_.max_tokens))
        : !lease.environment().empty()
            ? StartEpisodeLease(lease, params)
            : engine_->Add(lease.lease_id(), std::move(prompt), params);
    if (!status.ok()) {
      Log()->warn("lease {} refused: {}", lease.lease_id(),
                  std::string(status.message()));
      // Whatever this worker cannot run, another may: do not take the
      // prompt straight back.
      prefetcher_->Backoff(kRefusedLeaseBackoff);
      prefetcher_->Return({lease.lease_id()},
                          std::string(status.message()).substr(0, 1024));
      continue;
    }
    const std::string id = lease.lease_id();
    leases_[id] = {std::move(lease), params.n};
  }
}

void RolloutWorker::Deliver(engine::FinishedSample f,
                            const EpisodeResult* episode) {
  metrics_.RecordFinished(f);
  auto it = leases_.find(f.request_id);
  if (it == leases_.end()) return;
  const tandem::v1::PromptLease& lease = it->second.lease;
  tandem::v1::Sample sample;
  sample.set_sample_id(absl::StrCat(lease.lease_id(), "/", f.sample_index));
  sample.set_lease_id(lease.lease_id());
  sample.set_group_id(lease.group_id());
  sample.set_sample_index(static_cast<uint32_t>(f.sample_index));
  sample.mutable_completion_token_ids()->Add(f.output.begin(), f.output.end());
  sample.mutable_behavior_logprobs()->Add(f.logprobs.begin(), f.logprobs.end());
  for (const engine::VersionSpan& span : f.spans) {
    auto* out = sample.add_version_spans();
    out->set_policy_version(span.policy_version);
    out->set_num_tokens(span.num_tokens);
  }
  // Multi-turn episodes mark the environment's tokens (empty otherwise).
  for (const engine::SourceSpan& span : f.source_spans) {
    auto* out = sample.add_source_spans();
    out->set_source(span.source == engine::TokenSource::kEnvironment
                        ? tandem::v1::TOKEN_SOURCE_ENVIRONMENT
                        : tandem::v1::TOKEN_SOURCE_MODEL);
    out->set_num_tokens(span.num_tokens);
  }
  sample.set_finish_reason(ToProto(f.finish_reason));
  // Proto strings must be valid UTF-8; a completion may end mid-character.
  sample.set_completion_text(tokenizer::ToValidUtf8(
      model_.tokenizer->Decode(f.output, /*skip_special=*/true)));
  auto* timings = sample.mutable_timings();
  timings->set_admitted_unix_ms(absl::ToUnixMillis(f.admitted));
  timings->set_first_token_unix_ms(absl::ToUnixMillis(f.first_token));
  timings->set_finished_unix_ms(absl::ToUnixMillis(f.finished));
  timings->set_preemptions(f.preemptions);
  sample.set_worker_id(member_->session().member_id());
  if (episode != nullptr) {
    if (episode->reward) sample.set_environment_reward(*episode->reward);
    sample.set_episode_end_reason(episode->end_reason);
    sample.set_episode_end_text(
        tokenizer::ToValidUtf8(episode->end_text.substr(0, 4000)));
  }
  submitter_->Enqueue(std::move(sample));
  if (--it->second.remaining == 0) leases_.erase(it);
}

void RolloutWorker::PublishStatus() {
  const engine::EngineSnapshot snap = engine_->Snapshot();
  // Read before taking mu_: the prefetcher calls back into this class.
  const bool nothing_undelivered =
      submitter_->pending() == 0 && prefetcher_->depth() == 0;
  bool return_prefetched = false;
  {
    absl::MutexLock lock(&mu_);
    snapshot_ = snap;
    const absl::Time now = absl::Now();
    const absl::Duration window = now - rate_since_;
    if (window >= absl::Seconds(1)) {
      tokens_per_second_ =
          static_cast<double>(snap.generated_tokens - rate_tokens_) /
          absl::ToDoubleSeconds(window);
      rate_tokens_ = snap.generated_tokens;
      rate_since_ = now;
    }
    // Parked episodes leave the engine idle but are not finished.
    if (state_ == tandem::v1::ROLLOUT_STATE_DRAINING && engine_->idle() &&
        (!episodes_ || episodes_->active() == 0) &&
        (!harness_ || harness_->active() == 0)) {
      if (nothing_undelivered) {
        state_ = tandem::v1::ROLLOUT_STATE_DRAINED;
        metrics_.paused.Set(1);
        Log()->info("drained: no sequence in flight, every sample delivered");
      } else {
        // Leases that arrived after leasing stopped go back too.
        return_prefetched = true;
      }
    }
  }
  if (return_prefetched && prefetcher_->depth() > 0) {
    prefetcher_->ReturnQueued("drain");
  }
  AnswerDrainWaiters(/*all=*/false);
}

void RolloutWorker::GenerationLoop() {
  while (true) {
    bool generating = false;
    {
      absl::MutexLock lock(&mu_);
      auto runnable = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || state_ == tandem::v1::ROLLOUT_STATE_RUNNING ||
               state_ == tandem::v1::ROLLOUT_STATE_DRAINING;
      };
      clock_->AwaitWithTimeout(&mu_, absl::Condition(&runnable),
                               absl::Seconds(1));
      if (stop_) break;
      generating = state_ == tandem::v1::ROLLOUT_STATE_RUNNING;
      if (!runnable()) continue;
    }
    if (generating) {
      AdmitLeases();
      serving_.AdmitTo(engine_.get());
    }
    const bool idle = engine_->idle();
    // An idle engine still steps: that is where a staged weight version is
    // committed, and a worker too stale to get prompts must catch up.
    absl::StatusOr<engine::StepStats> step = engine_->Step();
    if (idle && step.ok() && !step->committed_update) {
      // Only parked episodes (or nothing) left: their environments' replies
      // resume or end them.
      PollAndDeliver();
      PublishStatus();
      // While running, a served request wakes the loop at once (draining
      // admits none: it would spin); leases and weight versions are
      // looked for every 5 ms (on the worker's clock; the two waits for
      // real I/O, an environment's reply and an HTTP request, are real).
      if (episodes_ && episodes_->active() > 0) {
        const absl::Time wait_start = absl::Now();
        environment_->WaitForReply(absl::Milliseconds(5));
        metrics_.environment_idle_waits.Increment();
        metrics_.environment_idle_seconds.Increment(
            absl::ToDoubleSeconds(absl::Now() - wait_start));
      } else if (generating) {
        serving_.WaitForWork(absl::Milliseconds(5));
      } else {
        clock_->SleepFor(absl::Milliseconds(5));
      }
      continue;
    }
    if (!step.ok()) {
      if (stopping_) break;  // e.g. parked for an in-place update
      Log()->error("engine step failed: {}; returning in-flight leases",
                   step.status().ToString());
      AbortAllWork("engine error",
                   absl::UnavailableError(absl::StrCat(
                       "the engine failed: ", step.status().message())));
      clock_->SleepFor(absl::Seconds(1));
      continue;
    }
    metrics_.RecordStep(*step, engine_->Snapshot());
    if (step->committed_update) {
      if (subscriber_) subscriber_->RecordLive(step->committed_version);
      absl::MutexLock lock(&mu_);
      last_pause_seconds_ = step->pause_seconds;
    }
    const std::vector<engine::TokenEvent> events = engine_->TakeTokenEvents();
    if (episodes_) episodes_->OnTokens(events);
    serving_.Dispatch(events);
    PollAndDeliver();
    PublishStatus();
  }
  // Unfinished work goes back to the coordinator for other workers.
  AbortAllWork("shutdown",
               absl::UnavailableError("the rollout worker is shutting down"));
}

void RolloutWorker::GracefulStop(absl::Duration deadline) {
  stopping_ = true;
  member_->MarkNotServing();
  Stop(deadline);
}

void RolloutWorker::Stop() { Stop(absl::Seconds(2)); }

void RolloutWorker::Stop(absl::Duration deadline) {
  stopping_ = true;
  if (stopped_.exchange(true)) return;
  const absl::Time give_up = absl::Now() + deadline;
  if (prefetcher_) prefetcher_->SetLeasing(false);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // A load in progress cannot be interrupted; the loader sees stop_ after it.
  // Each phase's duration goes to the final log line, so that a slow stop
  // names its cause.
  absl::Time phase_start = absl::Now();
  auto phase = [&phase_start] {
    const absl::Time now = absl::Now();
    const double seconds = absl::ToDoubleSeconds(now - phase_start);
    phase_start = now;
    return seconds;
  };
  const absl::Time stop_start = phase_start;
  if (loader_thread_.joinable()) loader_thread_.join();
  // An engine parked for an in-place update must not wait for the weights.
  if (inplace_source_) inplace_source_->Shutdown();
  serving_.Close(absl::UnavailableError("the rollout worker is shutting down"));
  if (generation_thread_.joinable()) generation_thread_.join();
  // The generation thread closed its episodes; calls still in flight are
  // cancelled.
  if (environment_) environment_->Stop();
  // Its sessions' requests were failed by the generation thread.
  openai_server_.reset();
  AnswerDrainWaiters(/*all=*/true);
  const double generation_s = phase();
  if (subscriber_) subscriber_->Stop();
  if (watcher_) watcher_->Stop();
  const double weights_s = phase();
  if (prefetcher_) {
    prefetcher_->Stop();
    prefetcher_->ReturnQueued("shutdown");
  }
  if (submitter_) {
    if (!submitter_->Flush(
            std::max(give_up - absl::Now(), absl::ZeroDuration()))) {
      Log()->warn("shutdown deadline passed with samples undelivered");
    }
    submitter_->Stop();
  }
  const double deliver_s = phase();
  if (member_) {
    member_->Shutdown(std::max(give_up - absl::Now(), absl::ZeroDuration()));
  }
  const double leave_s = phase();
  if (inplace_source_) {
    const InplaceWeightSource::Stats s = inplace_source_->stats();
    Log()->info(
        "in-place updates: {} writes ({} invalidated), engine park wait mean "
        "{:.2f} ms, max {:.2f} ms",
        s.writes, s.invalidations,
        s.writes == 0 ? 0.0 : 1000 * s.total_park_wait_seconds / s.writes,
        1000 * s.max_park_wait_seconds);
  }
  Log()->info(
      "stopped in {:.2f} s (generation {:.2f} s, weight sync {:.2f} s, leases "
      "and samples {:.2f} s, cluster and servers {:.2f} s)",
      absl::ToDoubleSeconds(absl::Now() - stop_start), generation_s, weights_s,
      deliver_s, leave_s);
}

}  // namespace tandem::rollout
