// GrpoTrainer::LearningRate: linear warmup, then constant or a cosine decay
// to lr * min_lr_ratio at total_steps; values hand-computed. A trainer whose
// state is restored at step k takes its next step at LearningRate(k + 1).

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/model/model_weights.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

std::unique_ptr<GrpoTrainer> MakeTrainer(const GrpoTrainerOptions& options) {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 3);
  REQUIRE(initial.ok());
  auto trainer = GrpoTrainer::Create(**initial, 0, options);
  REQUIRE(trainer.ok());
  return std::move(*trainer);
}

TEST_CASE("constant schedule: linear warmup, then lr") {
  GrpoTrainerOptions o;
  o.lr = 1e-3;
  o.warmup_steps = 10;
  auto t = MakeTrainer(o);
  CHECK(t->LearningRate(1) == Approx(1e-4).epsilon(1e-12));
  CHECK(t->LearningRate(5) == Approx(5e-4).epsilon(1e-12));
  CHECK(t->LearningRate(10) == Approx(1e-3).epsilon(1e-12));
  CHECK(t->LearningRate(1000) == Approx(1e-3).epsilon(1e-12));
  o.warmup_steps = 0;
  CHECK(MakeTrainer(o)->LearningRate(1) == Approx(1e-3).epsilon(1e-12));
}

TEST_CASE("cosine schedule decays from lr to lr * min_lr_ratio") {
  GrpoTrainerOptions o;
  o.lr = 1e-3;
  o.warmup_steps = 10;
  o.schedule = LrSchedule::kCosine;
  o.total_steps = 110;
  o.min_lr_ratio = 0.1;
  auto t = MakeTrainer(o);
  CHECK(t->LearningRate(5) == Approx(5e-4).epsilon(1e-12));
  CHECK(t->LearningRate(10) == Approx(1e-3).epsilon(1e-12));
  // A quarter of the way: 0.1 + 0.9 * (1 + cos(pi / 4)) / 2 = 0.868198...
  CHECK(t->LearningRate(35) == Approx(8.6819805e-4).epsilon(1e-7));
  // Half way: 0.1 + 0.9 * 0.5.
  CHECK(t->LearningRate(60) == Approx(5.5e-4).epsilon(1e-12));
  CHECK(t->LearningRate(110) == Approx(1e-4).epsilon(1e-12));
  CHECK(t->LearningRate(500) == Approx(1e-4).epsilon(1e-12));
  // Monotone after the warmup.
  for (int64_t s = 10; s < 120; ++s) {
    CHECK(t->LearningRate(s + 1) <= t->LearningRate(s));
  }
}

TEST_CASE("linear schedule decays from lr to lr * min_lr_ratio in a line") {
  GrpoTrainerOptions o;
  o.lr = 1e-3;
  o.warmup_steps = 10;
  o.schedule = LrSchedule::kLinear;
  o.total_steps = 110;
  o.min_lr_ratio = 0.1;
  auto t = MakeTrainer(o);
  CHECK(t->LearningRate(5) == Approx(5e-4).epsilon(1e-12));
  CHECK(t->LearningRate(10) == Approx(1e-3).epsilon(1e-12));
  // A quarter of the way: 0.1 + 0.9 * 0.75 (the cosine is at 0.868).
  CHECK(t->LearningRate(35) == Approx(7.75e-4).epsilon(1e-12));
  CHECK(t->LearningRate(60) == Approx(5.5e-4).epsilon(1e-12));
  CHECK(t->LearningRate(85) == Approx(3.25e-4).epsilon(1e-12));
  CHECK(t->LearningRate(110) == Approx(1e-4).epsilon(1e-12));
  CHECK(t->LearningRate(500) == Approx(1e-4).epsilon(1e-12));
}

TEST_CASE("linear schedule needs total_steps beyond the warmup") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 3);
  REQUIRE(initial.ok());
  GrpoTrainerOptions o;
  o.schedule = LrSchedule::kLinear;
  o.warmup_steps = 10;
  o.total_steps = 5;
  auto trainer = GrpoTrainer::Create(**initial, 0, o);
  REQUIRE_FALSE(trainer.ok());
  CHECK(trainer.status().message().find("linear schedule needs total_steps") !=
        std::string::npos);
}

TEST_CASE("cosine schedule needs total_steps beyond the warmup") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 3);
  REQUIRE(initial.ok());
  GrpoTrainerOptions o;
  o.schedule = LrSchedule::kCosine;
  o.warmup_steps = 10;
  o.total_steps = 10;
  auto trainer = GrpoTrainer::Create(**initial, 0, o);
  REQUIRE_FALSE(trainer.ok());
  CHECK(trainer.status().message().find("total_steps") != std::string::npos);
}

TEST_CASE("a restored trainer continues the schedule at the next step") {
  GrpoTrainerOptions o;
  o.lr = 1e-3;
  o.warmup_steps = 10;
  o.schedule = LrSchedule::kCosine;
  o.total_steps = 110;
  o.min_lr_ratio = 0.1;
  auto t = MakeTrainer(o);
  GrpoTrainerState state;
  state.step = 59;
  state.policy_version = 59;
  REQUIRE(t->RestoreState(state).ok());
  ScoredPromptGroup group;
  group.prompt = {2, 5, 7};
  for (int i = 0; i < 2; ++i) {
    ScoredCompletion c;
    c.tokens = {10 + i, 20};
    c.behavior_logprobs = {-4.5f, -4.5f};
    c.reward = i;
    group.completions.push_back(c);
  }
  auto stats = t->Step({group});
  REQUIRE(stats.ok());
  CHECK(stats->lr == Approx(5.5e-4).epsilon(1e-12));
  CHECK(stats->policy_version == 60);
  CHECK(t->step() == 60);
}

TEST_CASE("a restored trainer continues the linear schedule at the next step") {
  GrpoTrainerOptions o;
  o.lr = 1e-3;
  o.warmup_steps = 10;
  o.schedule = LrSchedule::kLinear;
  o.total_steps = 110;
  o.min_lr_ratio = 0.1;
  auto t = MakeTrainer(o);
  GrpoTrainerState state;
  state.step = 34;
  state.policy_version = 34;
  REQUIRE(t->RestoreState(state).ok());
  ScoredPromptGroup group;
  group.prompt = {2, 5, 7};
  for (int i = 0; i < 2; ++i) {
    ScoredCompletion c;
    c.tokens = {10 + i, 20};
    c.behavior_logprobs = {-4.5f, -4.5f};
    c.reward = i;
    group.completions.push_back(c);
  }
  auto stats = t->Step({group});
  REQUIRE(stats.ok());
  CHECK(stats->lr == Approx(7.75e-4).epsilon(1e-12));
  CHECK(t->step() == 35);
}

}  // namespace
}  // namespace tandem::trainer
