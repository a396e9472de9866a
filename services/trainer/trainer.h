#pragma once

// The trainer daemon: pulls scored groups from the coordinator, takes GRPO
// optimizer steps (GrpoTrainer), and publishes every new policy version:
// the weights go into a WeightStore served by this daemon's WeightServer
// (the pull path rollout workers follow; bfloat16 versions also as sparse
// deltas on the version before), the manifest to the coordinator, and the
// full weights to the broadcast group. The training thread is the
// TrainingLoop (training_loop.h, which states the publish protocol's side
// of the trainer); this class wires the parts and stops them in order.

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/cluster/member_daemon.h"
#include "common/model/model_config.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "services/trainer/checkpoint_manager.h"
#include "services/trainer/rendezvous_service.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "services/trainer/trainer_config.h"
#include "services/trainer/trainer_metrics.h"
#include "services/trainer/trainer_service.h"
#include "services/trainer/training_loop.h"
#include "services/trainer/weight_publisher.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

// The trainer daemon: owns the policy, the TrainingLoop (the training
// thread: pull, step, publish, checkpoint, evaluate), the weight store and
// server, the WeightPublisher and the gRPC service (TrainerService); wires
// them and stops them in order: the loop, the broadcast, the checkpoint on
// stop, the weight server's held polls, the gRPC server.
class Trainer {
 public:
  // `clock` (docs/architecture.md, "The clock seam") times the training
  // loop's retry pauses, the re-send wait, the weight server's long polls
  // and the member session; it must outlive the trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerConfig& config, Clock* clock = RealClock());
  ~Trainer();

  absl::Status Start();
  // Stops within `deadline` (drain_timeout_ms): a weight broadcast under way
  // gets what is left of it after the training thread stopped, then is
  // aborted; every thread is joined.
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // Test hooks, usable without Start() and without a coordinator: one
  // training step on `groups` whose new version is stored for the weight
  // server exactly as the TrainingLoop publishes it (without announcing it or
  // committing a batch), and the store and trainer it uses. `published`
  // (when not null): what DeltaPublisher made of the version (its device
  // copy, where its delta was found).
  absl::StatusOr<GrpoStepStats> TrainAndStoreForTest(
      const std::vector<ScoredPromptGroup>& groups,
      weights::PublishedVersion* published = nullptr);
  const weights::WeightStore& WeightStoreForTest() const { return store_; }
  const GrpoTrainer& GrpoTrainerForTest() const { return *grpo_; }

 private:
  Trainer(const TrainerConfig& config, Clock* clock);
  // The parts, in the order Create() makes them. The policy: the
  // checkpoint to resume from (when there is one), the GrpoTrainer on its
  // weights or the initial model's, and its KL reference; returns the dtype
  // versions are published in (the one rollout workers load).
  absl::StatusOr<model::WeightDType> CreatePolicy();
  absl::Status SetReferencePolicy(const model::ModelConfig& policy);
  // The weight server (the pull path) and, with weight_sync.broadcast, the
  // WeightPublisher and its rendezvous store.
  absl::Status CreateWeightServing();
  // The gRPC service and the member session that registers this trainer.
  absl::Status CreateMember();
  // Stop() with the time a broadcast under way may take to finish.
  void StopWithin(absl::Duration broadcast_drain);

  const TrainerConfig config_;
  Clock* const clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  TrainerMetrics metrics_;
  std::unique_ptr<GrpoTrainer> grpo_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  bool resumed_ = false;
  // SaveCheckpoint calls for the training loop; the status it keeps
  // current; the gRPC service that reads both.
  CheckpointRequestQueue checkpoint_requests_;
  TrainerStatusBoard status_;
  std::unique_ptr<TrainerService> service_;
  // Retains 4 versions; shares FULL ones in /dev/shm at publish when
  // weight_sync.shared_memory is on.
  weights::WeightStore store_;
  // weight_sync.cuda_ipc_versions on a GPU (null otherwise): read by the
  // weight server, filled by the training loop; outlives both.
  std::unique_ptr<weights::DeviceVersionRing> device_ring_;
  // The weights are on a CUDA device and the device weight sync is built
  // (CUDA and NCCL): versions get device copies (TrainingLoopParts::
  // device_copies) and deltas are found on the device (change_compactor_).
  bool device_sync_ = false;
  int cuda_index_ = 0;  // the weights' CUDA device when device_sync_
  std::unique_ptr<weights::ChangeCompactor> change_compactor_;
  // The raw data port's key (tls.mode mtls only; null otherwise), set by
  // the member session from the coordinator's data-plane secret.
  std::shared_ptr<weights::DataPlaneKeyHolder> data_plane_key_;
  std::unique_ptr<weights::WeightServerService> weight_server_;
  // The broadcast rendezvous store over gRPC (tls.mode mtls with
  // broadcast; null otherwise, when a TCPStore serves it).
  std::unique_ptr<RendezvousService> rendezvous_service_;
  std::unique_ptr<weights::WeightSyncMetrics> weight_sync_metrics_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  // Broadcast of each version to the current epoch's group and the re-send
  // protocol (null when weight_sync.broadcast is off). Declared after what
  // it uses (store_, metrics, member_'s coordinator client), so it goes
  // first; Stop() joins its threads before anything goes.
  std::unique_ptr<WeightPublisher> publisher_;
  // The training thread (pull, step, publish, checkpoint, evaluate); it
  // borrows most of the above, so it is declared last and goes first.
  std::unique_ptr<TrainingLoop> loop_;
  // Set when stopping starts; the heartbeat then reports DRAINING.
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace tandem::trainer
