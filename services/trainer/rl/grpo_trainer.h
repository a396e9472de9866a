#pragma once

// GrpoTrainer owns the trainable policy (fp32 master weights with
// autograd), its AdamW optimizer and learning-rate schedule, and turns a
// batch of scored groups into one optimizer step: a packed forward to the
// final hidden states, chunked log-probs of the completion tokens (never
// materialising [tokens, vocab]), the GRPO/PPO loss against the behavior
// log-probs the rollout workers recorded, backward, gradient clipping and
// an AdamW step. Each step produces the next policy version. Not
// thread-safe: one training thread (policy_version() excepted).

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "services/trainer/rl/grpo_batch.h"
#include "services/trainer/loss/chunked_logprobs.h"
#include "services/trainer/loss/grpo_loss.h"

namespace tandem::model {
class DecoderModel;
class ModelWeights;
}  // namespace tandem::model

namespace tandem::trainer {

// Learning rate after the warmup.
enum class LrSchedule {
  // lr.
  kConstant,
  // Half a cosine from lr down to lr * min_lr_ratio over the steps from
  // warmup_steps to total_steps; lr * min_lr_ratio after total_steps.
  kCosine,
  // A straight line from lr down to lr * min_lr_ratio over the same steps;
  // lr * min_lr_ratio after total_steps.
  kLinear,
};

struct GrpoTrainerOptions {
  GrpoLossOptions loss;
  TokenLogProbsOptions logprobs;
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  int64_t warmup_steps = 0;
  LrSchedule schedule = LrSchedule::kConstant;
  // kCosine and kLinear: total_steps > warmup_steps, min_lr_ratio in
  // [0, 1].
  int64_t total_steps = 0;
  double min_lr_ratio = 0.0;
  double max_grad_norm = 1.0;
  // Gradient accumulation: the batch's sequences are split, in order, into
  // micro-batches of at most this many packed (prompt + completion) tokens
  // (a longer sequence is a micro-batch of its own); each is forwarded and
  // backpropagated on its own with the loss normalised by the whole batch's
  // totals, then one optimizer step is taken. Peak activation memory then
  // scales with the micro-batch. 0 = the whole batch in one pass.
  int64_t micro_batch_tokens = 0;
  // Sequences whose advantage is exactly 0 (every sample of their group got
  // the same reward) add nothing to the policy loss or its gradient, since
  // every objective scales a token's term by its advantage; they are then
  // not forwarded at all (unless a reference policy is set, whose KL term
  // and statistic need every token, or no sequence has a non-zero advantage:
  // then all are forwarded, so the statistics stay defined). The
  // loss's denominators still count them, so the gradient is the same as
  // with them. false = forward every sequence (for tests).
  bool skip_zero_advantage = true;
  // Dynamic sampling (DAPO): a group whose completions all got the same
  // reward carries no advantage; with this on it is left out of the step
  // altogether, denominators included, so the loss is normalised over the
  // groups that carry a signal (with token-mean aggregation the update then
  // does not shrink as more groups are solved). A batch where every group
  // is uniform is stepped as it is (its policy gradient is zero either
  // way). Off: uniform groups count in the denominators (their sequences
  // are still not forwarded, see skip_zero_advantage).
  bool drop_uniform_groups = false;
  // Reference guidance (mixed-policy GRPO, as LUFFY): a group whose
  // completions all got the same reward below reference_reward, and whose
  // prompt has a reference completion, gets that reference as one more
  // completion with reward reference_reward. The group then carries an
  // advantage: the reference is pulled up and the failed samples pushed
  // down, where on-policy sampling alone gives no signal (a problem the
  // policy never solves). See ScoredCompletion::from_reference.
  bool reference_guidance = false;
  double reference_reward = 1.0;
  // Dtype of the forward and backward pass. kFloat32: the master weights
  // themselves. kBFloat16: mixed precision — a bfloat16 copy of the float32
  // master weights computes the loss and its gradient, the gradient is
  // accumulated into the float32 master (clipped there) and AdamW updates
  // the master, which is then copied back into the bfloat16 copy. The
  // master weights and the AdamW moments are float32 either way; the
  // reference policy (SetReferencePolicy) is kept in this dtype.
  model::WeightDType compute_dtype = model::WeightDType::kFloat32;
};

struct GrpoStepStats {
  uint64_t policy_version = 0;  // after the step
  GrpoLossStats loss;
  double grad_norm = 0.0;
  double lr = 0.0;
  double reward_mean = 0.0;
  double reward_std = 0.0;
  int64_t trained_tokens = 0;
  // Per completion: trainer version before the step minus its
  // min_policy_version.
  std::vector<int64_t> staleness;
  double step_seconds = 0.0;
  int64_t micro_batches = 0;
  // Completions not forwarded because their advantage was 0
  // (skip_zero_advantage); `loss`'s token statistics (ratio, clip
  // fraction, entropy) are over the forwarded ones (all of them when no
  // completion had a non-zero advantage).
  int64_t skipped_sequences = 0;
  // Groups (with completion tokens) whose rewards were all equal, and of
  // those, the ones left out of the step (drop_uniform_groups); dropped
  // groups' tokens are not in trained_tokens.
  int64_t uniform_groups = 0;
  int64_t dropped_uniform_groups = 0;
  // Groups that got their reference completion (reference_guidance).
  int64_t guided_groups = 0;
  // "reward", "loss" or "grad_norm" when that quantity was not finite (NaN
  // or infinite; a NaN behavior log-prob makes the loss NaN; a reward is
  // checked before anything is computed, since it would make its group's
  // advantages NaN): the step was skipped. No optimizer step was taken and the
  // gradients were zeroed, so the weights, the optimizer state, step() and
  // policy_version() are what they were before; `policy_version` is that
  // unchanged version. Empty when the step was taken.
  std::string nonfinite;
  bool skipped() const { return !nonfinite.empty(); }
};

// AdamW's per-parameter state.
struct AdamWMoments {
  int64_t step = 0;
  at::Tensor exp_avg;     // fp32, the parameter's shape
  at::Tensor exp_avg_sq;  // fp32, the parameter's shape
};

// Everything besides the master weights that a resumed GrpoTrainer needs to
// take exactly the step an uninterrupted one would take.
struct GrpoTrainerState {
  // Optimizer steps taken: the learning-rate schedule's position.
  int64_t step = 0;
  uint64_t policy_version = 0;
  // By parameter (Hugging Face) name; empty before the first step.
  std::map<std::string, AdamWMoments> moments;
};

class GrpoTrainer {
 public:
  // Takes the initial weights (any dtype and device; training runs on an
  // fp32 master copy on the same device, computing in
  // options.compute_dtype).
  // InvalidArgument names the option when `options` are inconsistent.
  static absl::StatusOr<std::unique_ptr<GrpoTrainer>> Create(
      const model::ModelWeights& initial, uint64_t initial_version,
      GrpoTrainerOptions options);
  ~GrpoTrainer();

  // One optimizer step over every completion of `groups`. A step whose
  // loss or gradient norm is not finite is skipped (GrpoStepStats::
  // nonfinite), never applied: non-finite values never reach the weights.
  absl::StatusOr<GrpoStepStats> Step(
      const std::vector<ScoredPromptGroup>& groups);

  // Sets the frozen reference policy of the KL penalty (options.loss.kl_beta
  // > 0; a Step with kl_beta > 0 and no reference fails with
  // FailedPrecondition). The trainer keeps a float32 copy of `reference` on
  // the policy's device, like the policy's master weights, so a reference
  // equal to the initial weights gives a KL of exactly 0 before the first
  // update; it never requires grad and is never updated. Each Step then
  // computes the reference log-probs of the trained tokens (packed forward
  // and chunked log-probs, under no-grad) and passes them to the loss, which
  // also reports their mean k3 KL. InvalidArgument when the vocabularies
  // differ; the architecture may otherwise differ from the policy's.
  absl::Status SetReferencePolicy(const model::ModelWeights& reference);
  bool has_reference_policy() const { return reference_ != nullptr; }

  // A detached copy of the current weights for publishing to rollout
  // workers and for checkpoints (in the master dtype). DataLoss naming the
  // first tensor with a NaN or infinite value, so that such weights are
  // never published or checkpointed (one min/max reduction per tensor and
  // one host sync, next to the copy itself).
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> SnapshotWeights() const;
  // The master weights themselves, checked as SnapshotWeights checks them
  // but not copied: for a caller that copies them at once (publishing
  // flattens them into its own buffer). REQUIRES: called on the thread that
  // calls Step, and the tensors read before the next Step changes them.
  absl::StatusOr<std::shared_ptr<const model::ModelWeights>>
  CheckedMasterWeights() const;
  // Safe to call from any thread (the trainer daemon's heartbeat reads it).
  uint64_t policy_version() const { return version_.load(); }
  // The policy in the compute dtype (what the loss is computed with).
  const model::DecoderModel& policy() const { return *policy_; }
  int64_t step() const { return step_; }
  const GrpoTrainerOptions& options() const { return options_; }

  // Learning rate of optimizer step `step` (1-based): lr * step /
  // warmup_steps during the warmup, then per options.schedule.
  double LearningRate(int64_t step) const;

  // A detached copy of the optimizer state, step and version (checkpoints).
  absl::StatusOr<GrpoTrainerState> CaptureState() const;
  // Restores what CaptureState returned. The master weights are not part of
  // the state: create the trainer from the checkpoint's weights. Errors
  // (InvalidArgument) name the parameter whose moments are missing, extra
  // or of the wrong shape; on error the trainer is unchanged.
  absl::Status RestoreState(const GrpoTrainerState& state);

  // The accumulated (clipped) gradient of the last Step, by parameter name;
  // undefined tensors before the first step.
  std::map<std::string, at::Tensor> GradientsForTest() const;

  // Renumbers the policy: the next Step() produces `version` + 1. For a
  // trainer that resumes behind or ahead of the coordinator's numbering.
  void set_policy_version(uint64_t version) { version_ = version; }

 private:
  GrpoTrainer() = default;
  struct Optimizer;

  void ZeroGradients();
  // Mixed precision: the compute copy's gradients become the master's.
  void GradientsToMaster();
  // Mixed precision: the updated master values into the compute copy.
  void MasterToCompute();

  GrpoTrainerOptions options_;
  // Computes the loss; its weights are master_ itself in float32.
  std::shared_ptr<model::DecoderModel> policy_;
  // The float32 master weights AdamW updates.
  std::shared_ptr<model::ModelWeights> master_;
  // Frozen (compute dtype, no grad); null unless SetReferencePolicy was called.
  std::shared_ptr<model::DecoderModel> reference_;
  std::unique_ptr<Optimizer> optimizer_;
  std::atomic<uint64_t> version_{0};
  int64_t step_ = 0;
};

// OK when every floating-point tensor of `weights` is finite; DataLoss
// naming the first that is not, with its NaN and infinity counts.
absl::Status CheckFiniteWeights(const model::ModelWeights& weights);

}  // namespace tandem::trainer
