#pragma once

// The GRPO-family policy loss over a packed batch of groups.
//
// A packed batch holds N sampled completions (sequences) laid end to end in
// T token slots. Each sequence belongs to a group (the samples of one
// prompt) and carries one scalar reward. Per-token inputs are the new
// log-probs (differentiable, from ComputeTokenLogProbs), the behavior
// log-probs recorded by the rollout worker for the weights that actually
// generated the token (this is asynchronous RL: not the trainer's previous
// step), optionally reference log-probs from a frozen model, and a mask that
// selects completion tokens (prompt and padding slots are 0).
//
// Per masked token t of sequence n with advantage A = A_n:
//   ratio r_t = exp(new_t - behavior_t)
//   kPpoClip:     l_t = -c_t * min(r_t A, clip(r_t, 1 - clip_low,
//                                          1 + clip_high) A),
//                 c_t = sg(min(1, is_cap / r_t)) if is_cap > 0, else 1
//   kTruncatedIs: l_t = -sg(min(r_t, is_cap)) * A * new_t
//                 (REINFORCE with a truncated importance weight; while
//                 r_t <= is_cap its gradient equals the unclipped PPO one)
//   plus, when kl_beta > 0, kl_beta * k3_t with the k3 estimator
//   k3_t = exp(ref_t - new_t) - (ref_t - new_t) - 1.
// sg() is stop-gradient. The l_t are aggregated per LossAggregation.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace tandem::trainer {

enum class AdvantageNormalization {
  // GRPO: (r - mean_group) / (std_group + eps), population std.
  kGroupMeanStd,
  // Dr. GRPO: r - mean_group.
  kGroupMean,
};

enum class PolicyObjective {
  // PPO clipped surrogate against the behavior log-probs.
  kPpoClip,
  // REINFORCE weighted by the truncated importance weight (stop-gradient).
  kTruncatedIs,
};

enum class LossAggregation {
  // Sum over all masked tokens / number of masked tokens.
  kTokenMean,
  // Mean over each sequence's masked tokens, then mean over the sequences
  // that have at least one masked token.
  kSequenceMean,
  // PipelineRL: sum over all masked tokens / number of sequences N.
  kSumOverSequences,
};

struct GrpoLossOptions {
  AdvantageNormalization advantage = AdvantageNormalization::kGroupMeanStd;
  // Added to the group std; >= 0. Groups whose rewards are all equal get
  // advantage exactly 0 regardless of eps.
  double advantage_eps = 1e-6;
  PolicyObjective objective = PolicyObjective::kPpoClip;
  // Ratio clip range [1 - clip_low, 1 + clip_high]; both >= 0, clip_low < 1.
  double clip_low = 0.2;
  double clip_high = 0.2;
  // Cap of the truncated importance weight min(r_t, is_cap), treated as a
  // constant (stop-gradient). In kTruncatedIs it is the token's weight. In
  // kPpoClip, if > 0, tokens whose ratio exceeds is_cap are additionally
  // down-weighted by the constant factor is_cap / r_t (stale tokens), which
  // leaves tokens with r_t <= is_cap untouched; <= 0 disables truncation
  // (kTruncatedIs then uses the untruncated ratio).
  double is_cap = 0.0;
  // Coefficient of the k3 KL penalty to the reference model; >= 0. Requires
  // reference log-probs when > 0.
  double kl_beta = 0.0;
  LossAggregation aggregation = LossAggregation::kTokenMean;
};

// Tensors are on one device. T tokens, N sequences.
struct PackedPolicyBatch {
  at::Tensor new_logprobs;        // [T] float, differentiable
  at::Tensor behavior_logprobs;   // [T] float
  at::Tensor reference_logprobs;  // [T] float, or undefined
  at::Tensor mask;                // [T] bool or 0/1 float; 1 = completion
  at::Tensor sequence_ids;        // [T] integral in [0, N)
  at::Tensor rewards;             // [N] float
  at::Tensor group_ids;           // [N] integral, any non-negative labels
  at::Tensor entropy;             // [T] float, or undefined (stats only)
  // Precomputed advantages [N] float (treated as constants), or undefined:
  // then they are computed from rewards and group_ids. When defined,
  // rewards and group_ids may be undefined. A micro-batch needs them: its
  // groups may be split across micro-batches, so the advantages come from
  // the whole batch (GroupAdvantages).
  at::Tensor advantages;
  // Gradient accumulation: when this batch is one micro-batch of a larger
  // batch, the larger batch's totals, used as the aggregation's
  // denominators so that the micro-batches' losses (and gradients) sum to
  // the whole batch's. 0 = this batch's own count.
  int64_t total_tokens = 0;  // kTokenMean: masked tokens
  // kSequenceMean: sequences with at least one masked token;
  // kSumOverSequences: sequences.
  int64_t total_sequences = 0;
};

// Plain numbers for logging; the service layer turns them into metrics.
// Token statistics are means over masked tokens.
struct GrpoLossStats {
  double loss = 0.0;
  double clip_fraction = 0.0;  // kPpoClip: tokens whose gradient is clipped
  double ratio_mean = 0.0;
  double kl_mean = 0.0;       // k3; 0 without reference log-probs
  double entropy_mean = 0.0;  // 0 without entropy
  // (sum w)^2 / sum w^2 / M over the M masked tokens' importance weights
  // w = min(r, is_cap) (untruncated when is_cap <= 0); 1 when on-policy.
  double effective_sample_size = 0.0;
  double advantage_mean = 0.0;  // over sequences
  double advantage_std = 0.0;   // population, over sequences
  int64_t num_tokens = 0;       // masked
  int64_t num_sequences = 0;
};

struct GrpoLossResult {
  at::Tensor loss;        // scalar float32, differentiable
  at::Tensor advantages;  // [N] float32, detached
  GrpoLossStats stats;
};

// Group-normalised advantages [N] float32 (detached).
absl::StatusOr<at::Tensor> GroupAdvantages(const at::Tensor& rewards,
                                           const at::Tensor& group_ids,
                                           const GrpoLossOptions& options);

// REQUIRES: options valid (checked; InvalidArgument otherwise) and shapes as
// documented on PackedPolicyBatch (checked). With zero masked tokens the
// loss is 0 (still differentiable) and the stats are 0.
absl::StatusOr<GrpoLossResult> ComputeGrpoLoss(const PackedPolicyBatch& batch,
                                               const GrpoLossOptions& options);

}  // namespace tandem::trainer
