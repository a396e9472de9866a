#pragma once

// TrainingLoop: the trainer daemon's training thread. Each turn it pulls a
// scored batch from the coordinator, takes a GRPO step, publishes the new
// version, checkpoints when due and evaluates on held-out problems when
// due:
//
//   pull (PullTrainingBatch) -> step (GrpoTrainer) -> publish -> checkpoint
//   -> evaluate
//
// Publishing: the version goes into the WeightStore (a full anchor or a
// sparse delta on the version before, weights::DeltaPublisher), is
// announced to the coordinator together with the batch that trained it (one
// idempotent PublishPolicyVersion keyed by the batch id, retried until the
// coordinator answers: publish protocol, services/coordinator/group_ledger.h)
// and is handed to the WeightPublisher for the broadcast. Checkpoints hold
// acknowledged versions only. A batch that cannot be trained (a non-finite
// step) is handed back at once.
//
// Ownership: the loop owns its thread, the held-out evaluator, the best
// policy keeper and the flat layout and delta state of published versions;
// everything in TrainingLoopParts is borrowed and must outlive it.
// Thread-safety: Start/Stop/FinishOnStop from the owner; the rest runs on
// the loop's thread (or, for the ForTest hook, before Start()).

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/cluster/member_session.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/delta_publisher.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "services/trainer/best_policy.h"
#include "services/trainer/checkpoint_manager.h"
#include "services/trainer/heldout_eval.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "services/trainer/trainer_config.h"
#include "services/trainer/trainer_metrics.h"
#include "services/trainer/trainer_service.h"
#include "services/trainer/weight_publisher.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::trainer {

// What the training loop works with; all borrowed (see the top of file).
struct TrainingLoopParts {
  const TrainerConfig* config = nullptr;
  GrpoTrainer* grpo = nullptr;
  CheckpointManager* checkpoints = nullptr;
  // The weights were restored from a checkpoint (for ReconcileVersion).
  bool resumed = false;
  // The dtype rollout workers hold; versions are published converted.
  model::WeightDType publish_dtype = model::WeightDType::kFloat32;
  // Where published versions go (served to pulling workers).
  weights::WeightStore* store = nullptr;
  // Versions kept in device memory for CUDA IPC (weight_sync
  // .cuda_ipc_versions on a GPU); null otherwise.
  weights::DeviceVersionRing* device_ring = nullptr;
  // Each version is also flattened into device memory (the weights on a
  // CUDA device, CUDA and NCCL built, and broadcast or deltas on): the
  // copy a FULL broadcast goes from over NCCL and the device base of the
  // next delta. One device flatten per version: with device_ring it is the
  // ring's buffer.
  bool device_copies = false;
  // Where deltas are found when both versions have device copies
  // (CudaChangeCompactor); null: on the host.
  weights::ChangeCompactor* change_compactor = nullptr;
  weights::WeightSyncMetrics* weight_sync_metrics = nullptr;
  // The broadcast to the epoch's group; null when weight_sync.broadcast is
  // off.
  WeightPublisher* publisher = nullptr;
  TrainerMetrics* metrics = nullptr;
  // The status the loop keeps current and the SaveCheckpoint calls it
  // answers (both read or filled by TrainerService).
  TrainerStatusBoard* status = nullptr;
  CheckpointRequestQueue* checkpoint_requests = nullptr;
  // The coordinator: its client, this trainer's member id ("" while
  // unregistered) and the latest version its heartbeats report.
  cluster::MemberSession* coordinator = nullptr;
  // The weight server's address, announced with each version (known once
  // the daemon serves).
  std::function<std::string()> weight_server_address;
  // Times the pauses before a retry (no member id yet, a failed
  // ResumeTraining or step, the publish backoff); gRPC deadlines and the
  // durations measured for metrics stay real time.
  Clock* clock = RealClock();
};

class TrainingLoop {
 public:
  // Builds the flat layout of published versions, the delta publisher and,
  // when config.eval.every_versions > 0, the held-out evaluator and best
  // policy keeper.
  static absl::StatusOr<std::unique_ptr<TrainingLoop>> Create(
      TrainingLoopParts parts);
  ~TrainingLoop();  // Stop()
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  // Starts the thread and accepts SaveCheckpoint calls.
  void Start();
  // Ends the step under way (a publish under retry gives up at once) and
  // joins the thread. Idempotent.
  void Stop();
  // REQUIRES: Stop() returned. Stops accepting SaveCheckpoint calls,
  // checkpoints what was trained (checkpoint.on_stop; never a version the
  // coordinator did not acknowledge) and answers the calls still queued.
  void FinishOnStop();

  // The current policy in the published dtype: the master weights
  // themselves when that is their dtype (valid until the next step; read
  // on the loop's thread), else a converted copy.
  absl::StatusOr<std::shared_ptr<const model::ModelWeights>> PublishedWeights()
      const;

  // Test hook, usable without Start() and without a coordinator: one step
  // on `groups` whose version is stored exactly as a publish stores it
  // (without announcing it or committing a batch); `published` (when not
  // null) receives the stored payloads.
  absl::StatusOr<GrpoStepStats> StepAndStoreForTest(
      const std::vector<ScoredPromptGroup>& groups,
      weights::PublishedVersion* published = nullptr);

 private:
  explicit TrainingLoop(TrainingLoopParts parts);
  void Run();
  absl::Status TrainOnce();
  absl::Status PullBatch(const std::string& member,
                         tandem::v1::PullTrainingBatchResponse* batch);
  // After a step skipped as non-finite: nothing was trained, no version to
  // publish and no batch to commit; the batch goes back at once.
  void HandBackSkippedStep(const std::string& batch_id, size_t groups,
                           const GrpoStepStats& stats);
  // After a successful step: metrics, the step's log line, the status.
  void RecordStep(const std::string& batch_id, size_t groups,
                  const GrpoStepStats& stats);
  // Hands a pulled batch back untrained (ReleaseTrainingBatch), so that its
  // groups are ready again at once rather than after batch_timeout_ms.
  // Best effort: on failure the batch still returns at its deadline.
  void ReleaseBatch(const std::string& batch_id, const std::string& reason);

  // Publishing (training_loop_publish.cc).
  // Stores `version` and announces it with the batch that trained it
  // (empty: none), retrying transport errors until the coordinator answers
  // or the loop stops. FailedPrecondition: the coordinator refused it.
  absl::Status Publish(uint64_t version, const std::string& batch_id);
  // After a refused publish: adopts the coordinator's latest version and
  // publishes the current weights after it, without a batch.
  absl::Status AdoptCoordinatorVersion(const absl::Status& refusal);
  // Flattens the current policy as `version` into the store (the full
  // copy, and a delta on version-1 when DeltaPublisher chose one); the
  // first half of Publish. Returns the payloads.
  absl::StatusOr<weights::PublishedVersion> StoreVersion(uint64_t version);
  // At the first registration, tells the coordinator which version the
  // weights hold (ResumeTraining: what later versions trained is queued
  // again or counted lost) and adopts its numbering; false until that
  // succeeded.
  bool ReconcileVersionOnce();
  // weight_sync.cuda_ipc_versions or device_copies: flattens `weights`
  // into a new device buffer for `version`, puts it in parts_.device_ring
  // (when there is one) and returns it; a failure is logged (once until
  // one succeeds) and the version served without it (null).
  std::shared_ptr<const weights::DeviceWeightBuffer> StoreDeviceVersion(
      const model::ModelWeights& weights, uint64_t version);

  // Checkpoints and held-out evaluation (training_loop.cc).
  absl::Status MaybeCheckpoint();
  void ServeCheckpointRequests();
  void RecordCheckpoint(const WrittenCheckpoint& written);
  void MaybeEvaluate(bool initial);
  // Offers the evaluated policy to the best policy keeper; the best so far
  // (nullopt without a keeper).
  std::optional<BestPolicy> OfferBestPolicy(uint64_t version,
                                            const HeldoutResult& result);

  // Fault injection for tests: with TANDEM_TEST_HOLD_PUBLISH_FILE set and
  // that file present, the loop writes <file>.held (the version and batch
  // it stepped to) and waits, stepped but not yet published, until the file
  // is removed or the loop stops.
  void HoldBeforePublishForTest(uint64_t version, const std::string& batch_id);
  // Fault injection for tests: with TANDEM_TEST_POISON_REWARDS_FILE set and
  // that file present, every reward of the batch is made NaN, so that the
  // step is skipped as non-finite (and its batch handed back).
  void PoisonRewardsForTest(std::vector<ScoredPromptGroup>* groups);

  // The settings (parts_.config) and the policy (parts_.grpo) are read
  // through parts_ only: one name for each.
  const TrainingLoopParts parts_;

  // Published versions (the loop's thread only).
  std::unique_ptr<weights::FlatWeightLayout> layout_;
  std::optional<weights::DeltaPublisher> delta_publisher_;

  // Held-out evaluation (the loop's thread only): the accuracies of the
  // last kHeldoutSmoothingWindow evaluations and the best policy by
  // held-out accuracy.
  static constexpr size_t kHeldoutSmoothingWindow = 5;
  std::unique_ptr<HeldoutEvaluator> evaluator_;
  std::unique_ptr<BestPolicyKeeper> best_policy_;
  int64_t last_evaluated_version_ = -1;
  std::deque<double> recent_heldout_;

  bool version_reconciled_ = false;  // the loop's thread only
  // The last step's version was not acknowledged by the coordinator (the
  // loop stopped while retrying): it must not be checkpointed. Written by
  // the loop's thread, read by FinishOnStop() after joining it.
  bool unacknowledged_step_ = false;
  bool device_ring_failed_ = false;  // the loop's thread only

  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace tandem::trainer
