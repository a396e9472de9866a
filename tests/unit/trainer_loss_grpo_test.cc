// ComputeGrpoLoss and GroupAdvantages on small hand-computed batches: each
// expected value below is worked out in the comment above it.

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "services/trainer/loss/grpo_loss.h"

namespace tandem::trainer {
namespace {

using Catch::Detail::Approx;

constexpr double kTol = 1e-6;

at::Tensor Floats(const std::vector<float>& v) {
  return at::tensor(at::ArrayRef<float>(v), at::kFloat);
}
at::Tensor Longs(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::kLong);
}

// new_logprobs = behavior + log(ratio), as a leaf that requires grad.
at::Tensor NewFromRatios(const at::Tensor& behavior,
                         const std::vector<float>& ratios) {
  return (behavior + Floats(ratios).log()).detach().requires_grad_(true);
}

void RequireTensorNear(const at::Tensor& got, const std::vector<float>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  const at::Tensor g = got.to(at::kDouble).contiguous();
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("index " << i);
    REQUIRE(g[i].item<double>() == Approx(want[i]).margin(kTol));
  }
}

struct Run {
  GrpoLossResult result;
  at::Tensor grad;  // d loss / d new_logprobs
};

Run RunLoss(PackedPolicyBatch batch, const GrpoLossOptions& options) {
  absl::StatusOr<GrpoLossResult> out = ComputeGrpoLoss(batch, options);
  REQUIRE(out.ok());
  out->loss.backward();
  return {*out, batch.new_logprobs.grad()};
}

TEST_CASE(
    "GRPO advantages are (r - mean) / std per group; Dr. GRPO omits "
    "std",
    "[trainer_loss]") {
  // Group 7: rewards 1 0 0 1, mean 0.5, population std 0.5.
  // Group 3: rewards 2 2 -> all equal -> 0.
  const at::Tensor rewards = Floats({1, 0, 0, 1, 2, 2});
  const at::Tensor groups = Longs({7, 7, 7, 7, 3, 3});
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  absl::StatusOr<at::Tensor> grpo = GroupAdvantages(rewards, groups, options);
  REQUIRE(grpo.ok());
  RequireTensorNear(*grpo, {1, -1, -1, 1, 0, 0});
  options.advantage = AdvantageNormalization::kGroupMean;
  absl::StatusOr<at::Tensor> dr = GroupAdvantages(rewards, groups, options);
  REQUIRE(dr.ok());
  RequireTensorNear(*dr, {0.5, -0.5, -0.5, 0.5, 0, 0});
  // With eps: 0.5 / (0.5 + 0.5) = 0.5.
  options.advantage = AdvantageNormalization::kGroupMeanStd;
  options.advantage_eps = 0.5;
  RequireTensorNear(*GroupAdvantages(rewards, groups, options),
                    {0.5, -0.5, -0.5, 0.5, 0, 0});
}

TEST_CASE(
    "A group with identical rewards has zero advantage and the loss "
    "has no NaN",
    "[trainer_loss]") {
  // 0.1 is inexact in binary; a float mean could differ from it by an ulp
  // and, divided by std + eps with eps = 0, give garbage or NaN.
  PackedPolicyBatch b;
  b.behavior_logprobs = Floats({-1, -2, -3});
  b.new_logprobs = NewFromRatios(b.behavior_logprobs, {1.5, 0.5, 1.0});
  b.mask = Floats({1, 1, 1});
  b.sequence_ids = Longs({0, 1, 2});
  b.rewards = Floats({0.1f, 0.1f, 0.1f});
  b.group_ids = Longs({0, 0, 0});
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  const Run run = RunLoss(b, options);
  RequireTensorNear(run.result.advantages, {0, 0, 0});
  REQUIRE(run.result.stats.loss == 0.0);
  RequireTensorNear(run.grad, {0, 0, 0});
  REQUIRE(run.result.stats.advantage_std == 0.0);
}

// Two sequences of one group, rewards 1 and 0 -> A = +1, -1 (eps = 0).
// Tokens: t0, t1 in sequence 0 (A = +1); t2, t3 in sequence 1 (A = -1);
// t4 is a prompt slot of sequence 0 (mask 0) with a wild behavior log-prob.
PackedPolicyBatch ClipBatch(const std::vector<float>& ratios) {
  PackedPolicyBatch b;
  b.behavior_logprobs = Floats({-1, -1.5, -2, -0.5, -100});
  b.new_logprobs = NewFromRatios(b.behavior_logprobs, ratios);
  b.mask = Floats({1, 1, 1, 1, 0});
  b.sequence_ids = Longs({0, 0, 1, 1, 0});
  b.rewards = Floats({1, 0});
  b.group_ids = Longs({0, 0});
  return b;
}

TEST_CASE(
    "PPO clipping on both sides zeroes the gradient only in the "
    "clipped regime",
    "[trainer_loss]") {
  // eps 0.2 / 0.2, ratios r = 1.5, 0.5, 0.5, 1.5 (t4's is irrelevant).
  //  t0 A=+1 r=1.5: min(1.5, 1.2) = 1.2, clipped above -> grad 0
  //  t1 A=+1 r=0.5: min(0.5, 0.8) = 0.5, not clipped  -> d(-rA)/dnew = -0.5
  //  t2 A=-1 r=0.5: min(-0.5, -0.8) = -0.8, clipped below -> grad 0
  //  t3 A=-1 r=1.5: min(-1.5, -1.2) = -1.5, not clipped -> +1.5
  // Token mean: (-1.2 - 0.5 + 0.8 + 1.5) / 4 = 0.15; grads / 4.
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  const Run run = RunLoss(ClipBatch({1.5, 0.5, 0.5, 1.5, 1.0}), options);
  REQUIRE(run.result.loss.item<double>() == Approx(0.15).margin(kTol));
  RequireTensorNear(run.grad, {0, -0.125, 0, 0.375, 0});
  REQUIRE(run.result.stats.clip_fraction == Approx(0.5));
  REQUIRE(run.result.stats.ratio_mean == Approx(1.0).margin(kTol));
  REQUIRE(run.result.stats.num_tokens == 4);
  REQUIRE(run.result.stats.advantage_mean == Approx(0.0).margin(kTol));
  REQUIRE(run.result.stats.advantage_std == Approx(1.0).margin(kTol));
  // ESS of the untruncated ratios 1.5 0.5 0.5 1.5: 16 / 5 / 4 = 0.8.
  REQUIRE(run.result.stats.effective_sample_size == Approx(0.8).margin(kTol));
}

TEST_CASE("PPO clip range is asymmetric (clip_low vs clip_high)",
          "[trainer_loss]") {
  // clip_low 0.1, clip_high 0.3: [0.9, 1.3].
  //  t0 A=+1 r=1.25: inside -> -1.25, grad -1.25
  //  t1 A=+1 r=1.35: above 1.3 -> -1.3, grad 0
  //  t2 A=-1 r=0.85: below 0.9 -> min(-0.85, -0.9) = -0.9 -> +0.9, grad 0
  //  t3 A=-1 r=0.95: inside -> +0.95, grad +0.95
  // Token mean: (-1.25 - 1.3 + 0.9 + 0.95) / 4 = -0.175.
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  options.clip_low = 0.1;
  options.clip_high = 0.3;
  const Run run = RunLoss(ClipBatch({1.25, 1.35, 0.85, 0.95, 1.0}), options);
  REQUIRE(run.result.loss.item<double>() == Approx(-0.175).margin(kTol));
  RequireTensorNear(run.grad, {-0.3125, 0, 0, 0.2375, 0});
  REQUIRE(run.result.stats.clip_fraction == Approx(0.5));
}

TEST_CASE("Truncated IS weight caps stale tokens and is stop-gradient",
          "[trainer_loss]") {
  // kTruncatedIs, cap 2: l = -min(r, 2) * A * new. A = +1 for t0, t1.
  //  t0 r=0.5: w 0.5, grad -0.5;  t1 r=3: w 2 (capped), grad -2.
  //  t2, t3 (A = -1) r=1: w 1, grad +1 each.
  // Token mean over 4: grads / 4. Value: -(0.5 n0 + 2 n1 - n2 - n3) / 4.
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  options.objective = PolicyObjective::kTruncatedIs;
  options.is_cap = 2.0;
  PackedPolicyBatch b = ClipBatch({0.5, 3.0, 1.0, 1.0, 1.0});
  const at::Tensor n = b.new_logprobs.detach();
  const double want = -(0.5 * n[0].item<double>() + 2.0 * n[1].item<double>() -
                        n[2].item<double>() - n[3].item<double>()) /
                      4.0;
  const Run run = RunLoss(b, options);
  REQUIRE(run.result.loss.item<double>() == Approx(want).margin(kTol));
  RequireTensorNear(run.grad, {-0.125, -0.5, 0.25, 0.25, 0});
  // ESS of w = 0.5 2 1 1: 4.5^2 / 6.25 / 4 = 0.81.
  REQUIRE(run.result.stats.effective_sample_size == Approx(0.81).margin(kTol));
  REQUIRE(run.result.stats.clip_fraction == 0.0);
}

TEST_CASE("PPO with an IS cap down-weights tokens above the cap",
          "[trainer_loss]") {
  // cap 2, clip 0.2. t3 A=-1 r=3: min(-3, -1.2) = -3, factor sg(2/3):
  // l = 2, grad = (2/3) * 3 = 2. t0 A=+1 r=1: -1, grad -1. t1, t2 r=1:
  // t1 -1 grad -1; t2 +1 grad +1. Token mean: (-1 - 1 + 1 + 2) / 4 = 0.25.
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  options.is_cap = 2.0;
  const Run run = RunLoss(ClipBatch({1.0, 1.0, 1.0, 3.0, 1.0}), options);
  REQUIRE(run.result.loss.item<double>() == Approx(0.25).margin(kTol));
  RequireTensorNear(run.grad, {-0.25, -0.25, 0.25, 0.5, 0});
}

TEST_CASE("KL penalty uses the k3 estimator with coefficient beta",
          "[trainer_loss]") {
  // Identical rewards -> A = 0, so only the KL term remains.
  // t0: ref - new = ln 2:  k3 = 2 - ln 2 - 1 = 0.3068528, dk3/dnew = 1 - 2 = -1
  // t1: ref - new = -ln 2: k3 = 0.5 + ln 2 - 1 = 0.1931472, dk3/dnew = 0.5
  // beta 0.1, token mean: 0.1 * 0.5 / 2 = 0.025; grads -0.05, 0.025.
  PackedPolicyBatch b;
  b.behavior_logprobs = Floats({-1, -2});
  b.new_logprobs = b.behavior_logprobs.clone().requires_grad_(true);
  b.reference_logprobs = Floats({-1 + std::log(2.0f), -2 - std::log(2.0f)});
  b.mask = Floats({1, 1});
  b.sequence_ids = Longs({0, 1});
  b.rewards = Floats({1, 1});
  b.group_ids = Longs({0, 0});
  GrpoLossOptions options;
  options.kl_beta = 0.1;
  const Run run = RunLoss(b, options);
  REQUIRE(run.result.loss.item<double>() == Approx(0.025).margin(kTol));
  RequireTensorNear(run.grad, {-0.05, 0.025});
  REQUIRE(run.result.stats.kl_mean == Approx(0.25).margin(kTol));
  // beta 0 (the default): the KL is still reported but not in the loss.
  b.new_logprobs = b.behavior_logprobs.clone().requires_grad_(true);
  options.kl_beta = 0.0;
  const Run off = RunLoss(b, options);
  REQUIRE(off.result.loss.item<double>() == 0.0);
  REQUIRE(off.result.stats.kl_mean == Approx(0.25).margin(kTol));
}

// kTruncatedIs at ratio 1 (new = behavior): l = -A * new.
// seq 0 (A=+1): new -1 -2 -3 -> l = 1 2 3
// seq 1 (A=-1): new -0.5     -> l = -0.5
// seq 2 (group 1, alone, A=0): new -1 -1 -> l = 0 0
// seq 3 (group 1, same reward, A=0): prompt only, no masked tokens.
PackedPolicyBatch AggregationBatch() {
  PackedPolicyBatch b;
  b.behavior_logprobs = Floats({-1, -2, -3, -0.5, -1, -1, -4});
  b.new_logprobs = b.behavior_logprobs.clone().requires_grad_(true);
  b.mask = Floats({1, 1, 1, 1, 1, 1, 0});
  b.sequence_ids = Longs({0, 0, 0, 1, 2, 2, 3});
  b.rewards = Floats({1, 0, 0.5, 0.5});
  b.group_ids = Longs({0, 0, 1, 1});
  b.entropy = Floats({1, 1, 1, 1, 2, 2, 100});
  return b;
}

TEST_CASE("Aggregations: token mean, sequence mean, sum over sequences",
          "[trainer_loss]") {
  GrpoLossOptions options;
  options.advantage_eps = 0.0;
  options.objective = PolicyObjective::kTruncatedIs;
  SECTION("token mean: (6 - 0.5) / 6 masked tokens") {
    options.aggregation = LossAggregation::kTokenMean;
    const Run run = RunLoss(AggregationBatch(), options);
    REQUIRE(run.result.loss.item<double>() == Approx(5.5 / 6).margin(kTol));
    const float g = 1.0f / 6;
    RequireTensorNear(run.grad, {-g, -g, -g, g, 0, 0, 0});
    // Entropy over masked tokens: (4 + 4) / 6.
    REQUIRE(run.result.stats.entropy_mean == Approx(8.0 / 6).margin(kTol));
  }
  SECTION("sequence mean: (2 - 0.5 + 0) / 3 sequences with tokens") {
    options.aggregation = LossAggregation::kSequenceMean;
    const Run run = RunLoss(AggregationBatch(), options);
    REQUIRE(run.result.loss.item<double>() == Approx(0.5).margin(kTol));
    const float g0 = 1.0f / 9;  // 1/3 tokens x 1/3 sequences
    const float g1 = 1.0f / 3;
    RequireTensorNear(run.grad, {-g0, -g0, -g0, g1, 0, 0, 0});
  }
  SECTION("PipelineRL: 5.5 / 4 sequences") {
    options.aggregation = LossAggregation::kSumOverSequences;
    const Run run = RunLoss(AggregationBatch(), options);
    REQUIRE(run.result.loss.item<double>() == Approx(5.5 / 4).margin(kTol));
    const float g = 0.25f;
    RequireTensorNear(run.grad, {-g, -g, -g, g, 0, 0, 0});
  }
}

TEST_CASE("Masked slots with extreme log-probs give no NaN or gradient",
          "[trainer_loss]") {
  // t4 has behavior -100 and new 0: exp(100) would overflow float32.
  PackedPolicyBatch b = ClipBatch({1, 1, 1, 1, 1});
  b.new_logprobs = b.new_logprobs.detach().clone();
  b.new_logprobs[4] = 0.0f;
  b.new_logprobs.requires_grad_(true);
  b.reference_logprobs = Floats({-1, -1.5, -2, -0.5, 50});
  GrpoLossOptions options;
  options.kl_beta = 0.5;
  options.is_cap = 2.0;
  const Run run = RunLoss(b, options);
  REQUIRE(std::isfinite(run.result.loss.item<double>()));
  REQUIRE(at::isfinite(run.grad).all().item<bool>());
  REQUIRE(run.grad[4].item<double>() == 0.0);
}

TEST_CASE("GRPO loss rejects bad options and shapes", "[trainer_loss]") {
  PackedPolicyBatch b = ClipBatch({1, 1, 1, 1, 1});
  GrpoLossOptions options;
  options.kl_beta = 0.1;  // no reference log-probs
  REQUIRE(ComputeGrpoLoss(b, options).status().code() ==
          absl::StatusCode::kInvalidArgument);
  options.kl_beta = 0.0;
  options.clip_low = 1.0;
  REQUIRE(ComputeGrpoLoss(b, options).status().code() ==
          absl::StatusCode::kInvalidArgument);
  options.clip_low = 0.2;
  b.sequence_ids = Longs({0, 0, 1, 2, 0});  // 2 >= N = 2
  REQUIRE(ComputeGrpoLoss(b, options).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::trainer
