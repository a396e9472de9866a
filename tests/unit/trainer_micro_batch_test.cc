// Gradient accumulation: a GRPO step over micro-batches accumulates the
// whole-batch gradient (float32 tolerance), for each loss aggregation,
// including groups split across micro-batches and a sequence longer than
// the micro-batch budget.

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/model/model_weights.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

// Three groups of four completions of varied lengths; behavior log-probs
// near the random policy's (uniform-ish over 97 tokens) so that ratios
// spread around 1 and some clip.
std::vector<ScoredPromptGroup> Batch() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(2, 96);
  std::uniform_int_distribution<int> length(1, 9);
  std::uniform_real_distribution<float> noise(-0.4f, 0.4f);
  std::vector<ScoredPromptGroup> groups(3);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int i = 0; i < 3 + static_cast<int>(g); ++i) {
      groups[g].prompt.push_back(token(rng));
    }
    for (int k = 0; k < 4; ++k) {
      ScoredCompletion c;
      // One long completion: longer than the micro-batch budget alone.
      const int n = (g == 1 && k == 2) ? 24 : length(rng);
      for (int i = 0; i < n; ++i) {
        c.tokens.push_back(token(rng));
        c.behavior_logprobs.push_back(-std::log(97.0f) + noise(rng));
      }
      c.reward = static_cast<double>((k * 3 + g) % 4) / 3.0;
      groups[g].completions.push_back(std::move(c));
    }
  }
  return groups;
}

struct Outcome {
  GrpoStepStats stats;
  std::map<std::string, at::Tensor> gradients;
};

Outcome StepWith(LossAggregation aggregation, int64_t micro_batch_tokens) {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 21);
  REQUIRE(initial.ok());
  GrpoTrainerOptions o;
  o.lr = 1e-3;
  o.max_grad_norm = 1e9;  // no clipping: compare raw gradients
  o.loss.aggregation = aggregation;
  o.micro_batch_tokens = micro_batch_tokens;
  auto trainer = GrpoTrainer::Create(**initial, 0, o);
  REQUIRE(trainer.ok());
  auto stats = (*trainer)->Step(Batch());
  REQUIRE(stats.ok());
  return {*stats, (*trainer)->GradientsForTest()};
}

void CheckSameStep(LossAggregation aggregation) {
  const Outcome whole = StepWith(aggregation, 0);
  const Outcome micro = StepWith(aggregation, 20);
  CHECK(whole.stats.micro_batches == 1);
  CHECK(micro.stats.micro_batches >= 4);
  CHECK(micro.stats.trained_tokens == whole.stats.trained_tokens);
  CHECK(whole.stats.grad_norm > 0);
  CHECK(micro.stats.grad_norm == Approx(whole.stats.grad_norm).epsilon(1e-4));
  CHECK(micro.stats.loss.loss ==
        Approx(whole.stats.loss.loss).epsilon(1e-4).margin(1e-6));
  // A token whose ratio sits on a clip boundary may flip under float
  // rounding: allow one.
  CHECK(micro.stats.loss.clip_fraction ==
        Approx(whole.stats.loss.clip_fraction)
            .margin(1.0 / whole.stats.trained_tokens + 1e-9));
  CHECK(whole.stats.loss.clip_fraction > 0);
  for (const auto& [name, g] : whole.gradients) {
    INFO(name);
    REQUIRE(g.defined());
    const at::Tensor& m = micro.gradients.at(name);
    REQUIRE(m.defined());
    const double scale = g.abs().max().item<double>();
    CHECK((m - g).abs().max().item<double>() <= 1e-4 * scale + 1e-7);
  }
}

TEST_CASE("micro-batches accumulate the whole-batch gradient: token mean") {
  CheckSameStep(LossAggregation::kTokenMean);
}

TEST_CASE("micro-batches accumulate the whole-batch gradient: sequence mean") {
  CheckSameStep(LossAggregation::kSequenceMean);
}

TEST_CASE("micro-batches accumulate the whole-batch gradient: pipelinerl") {
  CheckSameStep(LossAggregation::kSumOverSequences);
}

}  // namespace
}  // namespace tandem::trainer
