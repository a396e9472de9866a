// Dynamic sampling (GrpoTrainerOptions::drop_uniform_groups, the trainer's
// training.dynamic_sampling): a group whose completions all got the same
// reward is left out of the step, denominators included, so the step on
// {informative, uniform} equals the step on {informative} alone; without
// it the uniform group's tokens dilute the token-mean loss. Both count the
// uniform group.
//
// Reference guidance (reference_guidance, training.guide_failed_groups): a
// group whose samples all failed gets the dataset's reference completion
// as one more sample, trained at importance ratio 1; groups that did not
// all fail, or have no reference, are untouched.

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

ScoredPromptGroup Group(std::vector<double> rewards, int32_t first_token,
                        int length) {
  ScoredPromptGroup group;
  group.prompt = {3, first_token, 5};
  for (size_t k = 0; k < rewards.size(); ++k) {
    ScoredCompletion c;
    for (int i = 0; i < length; ++i) {
      c.tokens.push_back(first_token + static_cast<int32_t>(k) + i);
      c.behavior_logprobs.push_back(-4.5f);
    }
    c.reward = rewards[k];
    group.completions.push_back(std::move(c));
  }
  return group;
}

struct Outcome {
  GrpoStepStats stats;
  std::map<std::string, at::Tensor> gradients;
};

std::unique_ptr<GrpoTrainer> NewTrainer(bool drop, bool guide) {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 5);
  REQUIRE(initial.ok());
  GrpoTrainerOptions o;
  o.max_grad_norm = 1e9;  // no clipping: compare raw gradients
  o.loss.aggregation = LossAggregation::kTokenMean;
  o.drop_uniform_groups = drop;
  o.reference_guidance = guide;
  auto trainer = GrpoTrainer::Create(**initial, 0, o);
  REQUIRE(trainer.ok());
  return *std::move(trainer);
}

Outcome StepOn(const std::vector<ScoredPromptGroup>& groups, bool drop,
               bool guide = false) {
  auto trainer = NewTrainer(drop, guide);
  auto stats = trainer->Step(groups);
  REQUIRE(stats.ok());
  return {*stats, trainer->GradientsForTest()};
}

// Log-probs of `tokens` after `prompt` under the untrained policy of
// NewTrainer, one per token.
std::vector<float> PolicyLogProbs(const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& tokens) {
  auto trainer = NewTrainer(false, false);
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  auto logits = trainer->policy().ForwardPacked(
      torch::tensor(ids, torch::kLong), torch::arange(n, torch::kLong),
      torch::tensor(std::vector<int64_t>{0, n}, torch::kLong));
  REQUIRE(logits.ok());
  const at::Tensor logp = torch::log_softmax(logits->to(torch::kFloat), -1);
  std::vector<float> out;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int64_t row = static_cast<int64_t>(prompt.size() + k) - 1;
    out.push_back(logp[row][tokens[k]].item<float>());
  }
  return out;
}

double MaxAbsDifference(const Outcome& a, const Outcome& b) {
  double worst = 0.0;
  for (const auto& [name, grad] : a.gradients) {
    const at::Tensor& other = b.gradients.at(name);
    if (!grad.defined() || !other.defined()) continue;
    worst = std::max(worst, (grad - other).abs().max().item<double>());
  }
  return worst;
}

const ScoredPromptGroup kInformative = Group({1.0, 0.0, 1.0, 0.0}, 10, 3);
const ScoredPromptGroup kUniform = Group({1.0, 1.0, 1.0, 1.0}, 30, 9);

TEST_CASE("dynamic sampling: a uniform group leaves the step unchanged") {
  const Outcome alone = StepOn({kInformative}, /*drop=*/true);
  const Outcome with_uniform = StepOn({kInformative, kUniform}, true);
  CHECK(with_uniform.stats.uniform_groups == 1);
  CHECK(with_uniform.stats.dropped_uniform_groups == 1);
  CHECK(with_uniform.stats.trained_tokens == alone.stats.trained_tokens);
  CHECK(alone.stats.grad_norm > 0);
  CHECK(with_uniform.stats.grad_norm ==
        Approx(alone.stats.grad_norm).epsilon(1e-5));
  CHECK(MaxAbsDifference(alone, with_uniform) < 1e-6);
  // The reward statistics still cover every scored completion.
  CHECK(alone.stats.reward_mean == Approx(0.5));
  CHECK(with_uniform.stats.reward_mean == Approx(0.75));
}

TEST_CASE("without dynamic sampling a uniform group dilutes the token mean") {
  const Outcome alone = StepOn({kInformative}, /*drop=*/false);
  const Outcome with_uniform = StepOn({kInformative, kUniform}, false);
  CHECK(with_uniform.stats.uniform_groups == 1);
  CHECK(with_uniform.stats.dropped_uniform_groups == 0);
  // 12 informative tokens of 12 + 36: the gradient is a quarter.
  CHECK(with_uniform.stats.grad_norm ==
        Approx(alone.stats.grad_norm * 12.0 / 48.0).epsilon(1e-4));
}

TEST_CASE("dynamic sampling steps a batch of only uniform groups as it is") {
  const Outcome all_uniform =
      StepOn({kUniform, Group({0.0, 0.0, 0.0, 0.0}, 50, 2)}, true);
  CHECK(all_uniform.stats.uniform_groups == 2);
  CHECK(all_uniform.stats.dropped_uniform_groups == 0);
  CHECK(!all_uniform.stats.skipped());
  CHECK(all_uniform.stats.policy_version == 1);
}

ScoredPromptGroup WithReference(ScoredPromptGroup group,
                                std::vector<int32_t> reference) {
  group.reference = std::move(reference);
  return group;
}

TEST_CASE("reference guidance trains a failed group's reference at ratio 1") {
  const ScoredPromptGroup failed =
      WithReference(Group({0.0, 0.0, 0.0, 0.0}, 10, 3), {40, 41, 42});
  const Outcome guided = StepOn({failed}, /*drop=*/true, /*guide=*/true);
  CHECK(guided.stats.guided_groups == 1);
  CHECK(guided.stats.uniform_groups == 0);
  CHECK(guided.stats.dropped_uniform_groups == 0);
  CHECK(guided.stats.trained_tokens == 4 * 3 + 3);
  CHECK(guided.stats.grad_norm > 0);
  // The reward statistics are the rollouts' only.
  CHECK(guided.stats.reward_mean == Approx(0.0));

  // The same step with the reference as a sampled completion whose
  // behavior log-probs are the policy's own: the same gradient.
  ScoredPromptGroup by_hand = failed;
  ScoredCompletion reference;
  reference.tokens = failed.reference;
  reference.behavior_logprobs = PolicyLogProbs(failed.prompt, failed.reference);
  reference.reward = 1.0;
  by_hand.completions.push_back(reference);
  const Outcome manual = StepOn({by_hand}, true, /*guide=*/false);
  CHECK(manual.stats.grad_norm == Approx(guided.stats.grad_norm).epsilon(1e-4));
  CHECK(MaxAbsDifference(manual, guided) < 1e-5);
}

TEST_CASE("reference guidance leaves groups that did not all fail alone") {
  const std::vector<ScoredPromptGroup> groups = {
      WithReference(kInformative, {40, 41}),
      WithReference(kUniform, {40, 41}),  // all solved
      Group({0.0, 0.0, 0.0, 0.0}, 50, 2),  // failed, no reference
  };
  const Outcome guided = StepOn(groups, /*drop=*/true, /*guide=*/true);
  const Outcome plain = StepOn(groups, true, /*guide=*/false);
  CHECK(guided.stats.guided_groups == 0);
  CHECK(guided.stats.dropped_uniform_groups == 2);
  CHECK(guided.stats.grad_norm == Approx(plain.stats.grad_norm).epsilon(1e-6));
  CHECK(MaxAbsDifference(guided, plain) < 1e-7);
  // Off: a failed group's reference is ignored.
  const Outcome off = StepOn(
      {kInformative, WithReference(Group({0.0, 0.0}, 60, 2), {40})}, true);
  CHECK(off.stats.guided_groups == 0);
  CHECK(off.stats.dropped_uniform_groups == 1);
}

}  // namespace
}  // namespace tandem::trainer
