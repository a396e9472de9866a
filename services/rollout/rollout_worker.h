#pragma once

// The rollout worker daemon: a generation engine fed by a prompt
// prefetcher, streaming finished samples to the coordinator, with its
// control surface (status, pause, resume, drain) and cluster membership.
//
// Threads: the generation thread alone drives the Engine; the prefetcher
// and submitter have their own threads; gRPC reactors only flip flags and
// read the last published status. The model is loaded on a loader thread
// after the gRPC server is up, so that status and health answer (LOADING,
// NOT_SERVING) while a large checkpoint loads.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/chat/chat_template.h"
#include "common/cluster/cluster_watcher.h"
#include "common/cluster/member_daemon.h"
#include "common/model/model_loader.h"
#include "common/weights/cuda_ipc_device.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "services/rollout/environment_client.h"
#include "services/rollout/episode_driver.h"
#include "services/rollout/harness_episodes.h"
#include "services/rollout/openai_server.h"
#include "services/rollout/prompt_prefetcher.h"
#include "services/rollout/rollout_config.h"
#include "services/rollout/rollout_metrics.h"
#include "services/rollout/sample_submitter.h"
#include "services/rollout/serving_queue.h"
#include "services/rollout/weight_subscriber.h"
#include "services/rollout/weight_update_sources.h"
#include "tandem/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

class RolloutWorker : public tandem::v1::RolloutWorker::CallbackService {
 public:
  // `clock` times lease backoff, the weight subscriber's retry pauses and
  // pull waits, the membership session and watcher, harness episodes' idle
  // and lifetime limits (HarnessOptions::clock), and the generation loop's
  // pacing (the re-check while paused, the 5 ms idle pause while draining,
  // the pause after an engine error) (common/base/clock.h); it outlives
  // the worker. Drain answers and the stop deadline are real time: they
  // bound real calls. So are the idle loop's 5 ms waits for an
  // environment's reply or an HTTP request (real I/O; the 5 ms only caps
  // how soon leases and weights are looked for again).
  static absl::StatusOr<std::unique_ptr<RolloutWorker>> Create(
      const RolloutConfig& config, Clock* clock = RealClock());
  ~RolloutWorker() override;

  // Returns at once: the gRPC server already answers (state LOADING, health
  // NOT_SERVING); a loader thread loads the model, builds the engine, then
  // marks health SERVING, registers with the coordinator and starts
  // generating. A failed load is logged and leaves the worker NOT_SERVING.
  absl::Status Start();
  // Health NOT_SERVING, stops leasing, aborts in-flight generation and
  // returns every unfinished lease to the coordinator, delivers finished
  // samples (within `deadline`), leaves the cluster. A model load in
  // progress cannot be interrupted: stopping waits for it to end.
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // host:port of the gRPC server (bound at Create).
  const std::string& grpc_address() const { return member_->grpc_address(); }

  // Replaces LoadModel (e.g. with one that blocks, to observe LOADING).
  // REQUIRES: called before Start().
  void SetModelLoaderForTest(
      std::function<absl::StatusOr<model::LoadedModel>()> loader) {
    model_loader_ = std::move(loader);
  }

  // tandem.v1.RolloutWorker
  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetRolloutStatusRequest* request,
      tandem::v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Pause(grpc::CallbackServerContext* context,
                                  const tandem::v1::PauseRequest* request,
                                  tandem::v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Resume(
      grpc::CallbackServerContext* context,
      const tandem::v1::ResumeRequest* request,
      tandem::v1::RolloutStatus* response) override;
  // Stops admitting and leasing, gives back prompts not started, finishes
  // every in-flight sequence and delivers its samples; the state is
  // DRAINED once nothing is left. Answers when drained, when the state
  // leaves DRAINING (Resume, Pause, shutdown), or just before the call's
  // deadline (state DRAINING then), never blocking a reactor.
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const tandem::v1::DrainRequest* request,
                                  tandem::v1::RolloutStatus* response) override;

 private:
  struct LeaseState {
    tandem::v1::PromptLease lease;
    int32_t remaining = 0;
  };

  // A Drain call waiting for DRAINED.
  struct DrainWaiter {
    grpc::ServerUnaryReactor* reactor;
    tandem::v1::RolloutStatus* response;
    absl::Time answer_by;
  };

  RolloutWorker(const RolloutConfig& config, Clock* clock);
  void Stop(absl::Duration deadline);
  // Loader thread: the model-dependent parts, then the rest of Start.
  absl::Status LoadModelAndEngine();
  void LoadAndStart();
  // With tls.mode mtls: OK when the caller's certificate has the admin role
  // (Pause, Resume and Drain stop or start generation; GetStatus is open to
  // every role); UNAUTHENTICATED or PERMISSION_DENIED otherwise, logged and
  // counted in tandem_rollout_auth_refused_total. OK with tls.mode off.
  grpc::Status AuthorizeAdmin(const grpc::CallbackServerContext& context,
                              const char* method);
  // Moves the worker to `target` (Pause, Resume, Drain). UNAVAILABLE while
  // loading or shutting down.
  grpc::Status Transition(tandem::v1::RolloutState target);
  // Answers the Drain calls that are done waiting (all of them if `all`).
  void AnswerDrainWaiters(bool all);
  void GenerationLoop();
  // Starts the OpenAI endpoint (openai.listen) once the model is loaded.
  absl::Status StartOpenAIServer();
  // Aborts everything in the engine: leases go back to the coordinator,
  // served requests fail with `status`.
  void AbortAllWork(const std::string& reason, const absl::Status& status);
  void AdmitLeases();
  // Episodes (rollout_worker_episodes.cc). StartEpisodes makes the
  // environment client and the driver when environment.address is set.
  absl::Status StartEpisodes();
  // Starts the episodes of a lease that names an environment; a worker
  // without environment.address refuses it with the reason.
  absl::Status StartEpisodeLease(const tandem::v1::PromptLease& lease,
                                 engine::SamplingParams params);
  // Polls the driver and delivers the engine's finished samples (episodes
  // through the driver, served requests to their sessions).
  void PollAndDeliver();
  // Aborted episodes of a lease still held give the lease back.
  void DeliverEpisode(EpisodeResult result);
  // Harness episodes (rollout_worker_episodes.cc): offers a lease's
  // episodes; submits the groups whose episodes all finished and returns
  // the leases given up.
  absl::Status OfferHarnessLease(const tandem::v1::PromptLease& lease,
                                 const engine::SamplingParams& params);
  void DeliverHarness();
  // `episode` (may be null) adds the episode's reward and end reason.
  void Deliver(engine::FinishedSample sample,
               const EpisodeResult* episode = nullptr);
  void PublishStatus();
  void FillStatus(tandem::v1::RolloutStatus* status);
  void FillHeartbeat(tandem::v1::HeartbeatRequest* request);

  const RolloutConfig config_;
  Clock* const clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  RolloutMetrics metrics_;
  model::LoadedModel model_;
  std::unique_ptr<engine::TorchEngineModel> engine_model_;
  // Exactly one of the two, by engine.update_mode (staged | inplace).
  std::unique_ptr<StagedWeightSource> weight_source_;
  std::unique_ptr<InplaceWeightSource> inplace_source_;
  std::unique_ptr<engine::Engine> engine_;    // generation thread only
  // With environment.address: the client (thread-safe, stopped after the
  // generation thread is joined) and the driver (generation thread only).
  std::unique_ptr<EnvironmentClient> environment_;
  std::unique_ptr<EpisodeDriver> episodes_;
  // The model's chat template, kept for the driver's observation codec.
  std::shared_ptr<const chat::LoadedChatTemplates> episode_templates_;
  std::map<std::string, LeaseState> leases_;  // generation thread only
  // The engine's second source of sequences: OpenAI endpoint requests.
  ServingQueue serving_;
  // With openai.harness_environment: episodes driven by agent harnesses
  // (thread-safe; outlives the server, which records turns into it).
  std::unique_ptr<HarnessEpisodes> harness_;
  // Declared after serving_: its sessions cancel into it when destroyed.
  std::unique_ptr<OpenAIServer> openai_server_;
  // The raw weight data path's key (tls.mode mtls only; null otherwise),
  // set by the member session from the coordinator's data-plane secret.
  std::shared_ptr<weights::DataPlaneKeyHolder> data_plane_key_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  std::unique_ptr<PromptPrefetcher> prefetcher_;
  std::unique_ptr<SampleSubmitter> submitter_;
  std::unique_ptr<weights::WeightSyncMetrics> weight_sync_metrics_;
  // weight_sync.cuda_ipc on a GPU: the pulls' device side. Declared
  // before the subscriber: outlives it.
  std::unique_ptr<weights::CudaIpcDeviceSink> cuda_ipc_sink_;
  // Broadcast mode with weight_sync.watch: wakes the subscriber on
  // cluster events. Declared first: outlives the subscriber.
  std::unique_ptr<cluster::ClusterWatcher> watcher_;
  std::unique_ptr<WeightSubscriber> subscriber_;
  std::function<absl::StatusOr<model::LoadedModel>()> model_loader_;
  std::thread loader_thread_;
  std::thread generation_thread_;
  // Set by the loader thread once the model-dependent members (engine_,
  // subscriber_, ...) exist; RPC threads read them only after seeing it.
  std::atomic<bool> loaded_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  tandem::v1::RolloutState state_ ABSL_GUARDED_BY(mu_) =
      tandem::v1::ROLLOUT_STATE_LOADING;
  std::vector<DrainWaiter> drain_waiters_ ABSL_GUARDED_BY(mu_);
  engine::EngineSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  double tokens_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  double last_pause_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rate_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time rate_since_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
