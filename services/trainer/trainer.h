#pragma once

// The trainer daemon: pulls scored groups from the coordinator, takes GRPO
// optimizer steps (GrpoTrainer), and publishes every new policy version:
// the weights go into a WeightStore served by this daemon's WeightServer
// (the pull path rollout workers follow; bfloat16 versions also as sparse
// deltas on the version before, weights::DeltaPublisher), the manifest to
// the coordinator, and the full weights to the broadcast group.
// Each version is published together with the batch it trained (one
// idempotent PublishPolicyVersion keyed by the batch id, retried until the
// coordinator answers), so the coordinator commits the batch exactly when
// it records the version; checkpoints hold acknowledged versions only
// (publish protocol: services/coordinator/group_ledger.h).

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster/member_daemon.h"
#include "common/model/model_config.h"
#include "common/weights/delta_publisher.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "services/trainer/best_policy.h"
#include "services/trainer/checkpoint_manager.h"
#include "services/trainer/heldout_eval.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "services/trainer/trainer_config.h"
#include "services/trainer/trainer_metrics.h"
#include "services/trainer/trainer_service.h"
#include "services/trainer/weight_publisher.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

// The trainer daemon: owns the policy, the training thread (pull, step,
// publish, checkpoint, evaluate), the weight store and server, the
// WeightPublisher and the gRPC service (TrainerService), and stops them in
// order.
class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerConfig& config);
  ~Trainer();

  absl::Status Start();
  // Stops within `deadline` (drain_timeout_ms): a weight broadcast under way
  // gets what is left of it after the training thread stopped, then is
  // aborted; every thread is joined.
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // Test hooks, usable without Start() and without a coordinator: one
  // training step on `groups` whose new version is stored for the weight
  // server exactly as TrainOnce() publishes it (without announcing it or
  // committing a batch), and the store and trainer it uses.
  absl::StatusOr<GrpoStepStats> TrainAndStoreForTest(
      const std::vector<ScoredPromptGroup>& groups);
  const weights::WeightStore& WeightStoreForTest() const { return store_; }
  const GrpoTrainer& GrpoTrainerForTest() const { return *grpo_; }

 private:
  explicit Trainer(const TrainerConfig& config);
  void TrainingLoop();
  absl::Status TrainOnce();
  // Hands a pulled batch back untrained (ReleaseTrainingBatch), so that its
  // groups are ready again at once rather than after batch_timeout_ms.
  // Best effort: on failure the batch still returns at its deadline.
  void ReleaseBatch(const std::string& batch_id, const std::string& reason);
  // Stores `version` and announces it with the batch that trained it
  // (empty: none), retrying transport errors until the coordinator answers
  // or the trainer stops. FailedPrecondition: the coordinator refused it.
  absl::Status Publish(uint64_t version, const std::string& batch_id);
  // After a refused publish: adopts the coordinator's latest version and
  // publishes the current weights after it, without a batch.
  absl::Status AdoptCoordinatorVersion(const absl::Status& refusal);
  // Fault injection for tests: with TANDEM_TEST_HOLD_PUBLISH_FILE set and
  // that file present, the trainer writes <file>.held (the version and
  // batch it stepped to) and waits, stepped but not yet published, until
  // the file is removed or the trainer stops.
  void HoldBeforePublishForTest(uint64_t version, const std::string& batch_id);
  // Fault injection for tests: with TANDEM_TEST_POISON_REWARDS_FILE set and
  // that file present, every reward of the batch is made NaN, so that the
  // step is skipped as non-finite (and its batch handed back).
  void PoisonRewardsForTest(std::vector<ScoredPromptGroup>* groups);
  // Stop() with the time a broadcast under way may take to finish.
  void StopWithin(absl::Duration broadcast_drain);
  // Flattens the current policy as `version` into store_ (served to pulling
  // workers: the full copy, and a delta on version-1 when DeltaPublisher
  // chose one); the first half of Publish. Returns the payloads.
  absl::StatusOr<weights::PublishedVersion> StoreVersion(uint64_t version);
  // The current policy converted to the dtype rollout workers hold.
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> PublishedWeights() const;
  // Checkpoints (training thread): at the first registration, tell the
  // coordinator which version the weights hold (ResumeTraining: what later
  // versions trained is queued again or counted lost) and adopt its
  // numbering; false until that succeeded. Periodic checkpoints;
  // SaveCheckpoint calls.
  bool ReconcileVersionOnce();
  absl::Status MaybeCheckpoint();
  void ServeCheckpointRequests();
  void RecordCheckpoint(const WrittenCheckpoint& written);
  // Held-out evaluation of the current policy (when configured and due).
  void MaybeEvaluate(bool initial);

  const TrainerConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  TrainerMetrics metrics_;
  std::unique_ptr<HeldoutEvaluator> evaluator_;
  model::WeightDType publish_dtype_ = model::WeightDType::kFloat32;
  int64_t last_evaluated_version_ = -1;  // training thread only
  // Accuracies of the last kHeldoutSmoothingWindow evaluations (training
  // thread only), and the best policy by held-out accuracy.
  static constexpr size_t kHeldoutSmoothingWindow = 5;
  std::deque<double> recent_heldout_;
  std::unique_ptr<BestPolicyKeeper> best_policy_;

  std::unique_ptr<GrpoTrainer> grpo_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  bool resumed_ = false;
  bool version_reconciled_ = false;  // training thread only
  // The last step's version was not acknowledged by the coordinator (the
  // trainer stopped while retrying): it must not be checkpointed. Written
  // by the training thread, read by Stop() after joining it.
  bool unacknowledged_step_ = false;
  // SaveCheckpoint calls for the training thread; the status it keeps
  // current; the gRPC service that reads both.
  CheckpointRequestQueue checkpoint_requests_;
  TrainerStatusBoard status_;
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<weights::FlatWeightLayout> layout_;
  // Full anchor or sparse delta per version (training thread only).
  std::optional<weights::DeltaPublisher> delta_publisher_;
  // Retains 4 versions; shares FULL ones in /dev/shm at publish when
  // weight_sync.shared_memory is on.
  weights::WeightStore store_;
  // The raw data port's key (tls.mode mtls only; null otherwise), set by
  // the member session from the coordinator's data-plane secret.
  std::shared_ptr<weights::DataPlaneKeyHolder> data_plane_key_;
  std::unique_ptr<weights::WeightServerService> weight_server_;
  std::unique_ptr<weights::WeightSyncMetrics> weight_sync_metrics_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  // Broadcast of each version to the current epoch's group and the re-send
  // protocol (null when weight_sync.broadcast is off). Declared after what
  // it uses (store_, metrics, member_'s stub), so it goes first; Stop()
  // joins its threads before anything goes.
  std::unique_ptr<WeightPublisher> publisher_;
  std::thread training_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace tandem::trainer
