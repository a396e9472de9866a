// The GRPO optimizer step moves the policy the right way: rewarding samples
// whose first completion token is even raises the probability of even first
// tokens; a batch whose groups all have equal rewards leaves the weights
// unchanged and finite; a NaN behavior log-prob or reward skips the step
// (no update, no version) instead of poisoning the weights, and weights
// with a NaN are never snapshotted for publishing.

#include <torch/torch.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "tests/unit/grpo_test_util.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

std::vector<std::vector<int32_t>> Prompts() { return testing::FourPrompts(); }

// Generates `n` samples per prompt with the engine on `weights`.
std::vector<ScoredPromptGroup> Generate(
    std::shared_ptr<model::ModelWeights> weights, int n, uint64_t seed,
    int rewarded_parity = 0, const std::vector<float>& temperatures = {}) {
  auto groups = testing::SampleScoredGroups(std::move(weights), Prompts(),
                                            {.n = n,
                                             .seed = seed,
                                             .rewarded_parity = rewarded_parity,
                                             .temperatures = temperatures});
  REQUIRE(groups.ok());
  return *std::move(groups);
}

// Mean over prompts of the probability that the first completion token is
// even.
double EvenMass(const model::DecoderModel& policy) {
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& prompt : Prompts()) {
    std::vector<int64_t> ids(prompt.begin(), prompt.end());
    const int64_t n = static_cast<int64_t>(ids.size());
    auto logits = policy.ForwardPacked(
        torch::tensor(ids, torch::kLong), torch::arange(n, torch::kLong),
        torch::tensor(std::vector<int64_t>{0, n}, torch::kLong));
    REQUIRE(logits.ok());
    auto probs = torch::softmax(logits->to(torch::kFloat)[n - 1], -1);
    total +=
        probs.index({torch::arange(0, probs.size(0), 2)}).sum().item<double>();
  }
  return total / Prompts().size();
}

// Trains 8 steps rewarding first tokens of `parity`; returns the even mass
// before and after.
std::pair<double, double> Train(int parity) {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 11);
  REQUIRE(initial.ok());
  GrpoTrainerOptions options;
  options.lr = 1e-2;
  auto trainer = GrpoTrainer::Create(**initial, 0, options);
  REQUIRE(trainer.ok());
  const double before = EvenMass((*trainer)->policy());
  for (int step = 0; step < 8; ++step) {
    auto snapshot = (*trainer)->SnapshotWeights();
    REQUIRE(snapshot.ok());
    auto groups = Generate(*snapshot, 8, 1 + step, parity);
    auto stats = (*trainer)->Step(groups);
    REQUIRE(stats.ok());
    CHECK(stats->policy_version == static_cast<uint64_t>(step + 1));
    CHECK(std::isfinite(stats->loss.loss));
    CHECK(stats->trained_tokens == 4 * 8 * 4);
  }
  return {before, EvenMass((*trainer)->policy())};
}

TEST_CASE("GRPO steps raise the probability of rewarded behaviour") {
  const auto [before, after] = Train(/*parity=*/0);
  INFO("even-token mass before " << before << " after " << after);
  CHECK(after > before + 0.1);
  // The same run rewarding odd tokens moves the other way: a sign error in
  // the advantage or the ratio would fail one of the two.
  const auto [before_odd, after_odd] = Train(/*parity=*/1);
  INFO("rewarding odd: before " << before_odd << " after " << after_odd);
  CHECK(after_odd < before_odd - 0.1);
}

TEST_CASE("log-probs are taken at each group's sampling temperature") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 13);
  REQUIRE(initial.ok());
  const std::vector<float> temperatures = {0.5f, 1.7f, 1.0f, 0.0f};
  auto ratio_after_one_step = [&](bool tell_temperature) {
    auto trainer = GrpoTrainer::Create(**initial, 0, GrpoTrainerOptions());
    REQUIRE(trainer.ok());
    auto snapshot = (*trainer)->SnapshotWeights();
    REQUIRE(snapshot.ok());
    auto groups = Generate(*snapshot, 4, 7, 0, temperatures);
    for (size_t p = 0; p < groups.size(); ++p) {
      if (tell_temperature) groups[p].temperature = temperatures[p];
    }
    auto stats = (*trainer)->Step(groups);
    REQUIRE(stats.ok());
    return stats->loss;
  };
  // On-policy: the trainer's log-probs equal the sampler's when it uses the
  // groups' temperatures (greedy counts as 1)...
  const GrpoLossStats told = ratio_after_one_step(true);
  CHECK(told.ratio_mean == Approx(1.0).margin(1e-4));
  CHECK(told.clip_fraction == 0.0);
  // ...and not when it assumes temperature 1 for every group.
  const GrpoLossStats assumed = ratio_after_one_step(false);
  CHECK(std::abs(assumed.ratio_mean - 1.0) > 0.01);

  auto trainer = GrpoTrainer::Create(**initial, 0, GrpoTrainerOptions());
  REQUIRE(trainer.ok());
  auto snapshot = (*trainer)->SnapshotWeights();
  REQUIRE(snapshot.ok());
  auto groups = Generate(*snapshot, 2, 9);
  groups[2].temperature = -1.0;
  auto bad = (*trainer)->Step(groups);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("group 2: sampling temperature") !=
        std::string::npos);
}

TEST_CASE(
    "sequences with zero advantage are skipped without changing the "
    "gradient") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 14);
  REQUIRE(initial.ok());
  auto make = [&](bool skip) {
    GrpoTrainerOptions options;
    options.skip_zero_advantage = skip;
    auto trainer = GrpoTrainer::Create(**initial, 0, options);
    REQUIRE(trainer.ok());
    return std::move(*trainer);
  };
  auto skipping = make(true);
  auto forwarding = make(false);
  auto snapshot = skipping->SnapshotWeights();
  REQUIRE(snapshot.ok());
  auto groups = Generate(*snapshot, 4, 5);
  // Groups 0 and 2 have equal rewards (advantage 0), 1 and 3 mixed ones.
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].completions.size(); ++i) {
      groups[g].completions[i].reward =
          g % 2 == 0 ? 1.0 : static_cast<double>(i % 2);
    }
  }
  auto skipped = skipping->Step(groups);
  auto forwarded = forwarding->Step(groups);
  REQUIRE(skipped.ok());
  REQUIRE(forwarded.ok());
  CHECK(skipped->skipped_sequences == 8);
  CHECK(forwarded->skipped_sequences == 0);
  CHECK(skipped->trained_tokens == forwarded->trained_tokens);
  CHECK(skipped->loss.loss == Approx(forwarded->loss.loss).margin(1e-7));
  CHECK(skipped->grad_norm == Approx(forwarded->grad_norm).epsilon(1e-5));
  CHECK(skipped->grad_norm > 0.0);
  const auto a = skipping->GradientsForTest();
  const auto b = forwarding->GradientsForTest();
  for (const auto& [name, grad] : b) {
    INFO(name);
    REQUIRE(a.at(name).defined());
    CHECK(torch::allclose(a.at(name), grad, 1e-5, 1e-7));
  }
}

// One step from the same initial weights on `groups`; the weights after.
std::shared_ptr<model::ModelWeights> StepOnce(
    const std::vector<ScoredPromptGroup>& groups, int64_t* trained_tokens) {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 13);
  REQUIRE(initial.ok());
  GrpoTrainerOptions options;
  options.lr = 1e-2;
  auto trainer = GrpoTrainer::Create(**initial, 0, options);
  REQUIRE(trainer.ok());
  auto stats = (*trainer)->Step(groups);
  REQUIRE(stats.ok());
  REQUIRE_FALSE(stats->skipped());
  *trained_tokens = stats->trained_tokens;
  auto after = (*trainer)->SnapshotWeights();
  REQUIRE(after.ok());
  return *after;
}

bool SameWeights(const model::ModelWeights& a, const model::ModelWeights& b) {
  for (const auto& [name, tensor] : a.tensors()) {
    if (!torch::equal(tensor, b.tensors().at(name))) return false;
  }
  return true;
}

TEST_CASE(
    "an episode's environment tokens are context, never loss terms: their "
    "behavior log-probs do not move the step") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 13);
  REQUIRE(initial.ok());
  const std::vector<ScoredPromptGroup> sampled = Generate(*initial, 4, 21);
  // Tokens 1 and 3 of every completion came from the environment.
  auto episodes = sampled;
  for (auto& g : episodes) {
    for (auto& c : g.completions) c.trained = {1, 0, 1, 0};
  }
  // The same episodes with other behavior log-probs on those tokens.
  auto perturbed = episodes;
  for (auto& g : perturbed) {
    for (auto& c : g.completions) {
      c.behavior_logprobs[1] = -7.5f;
      c.behavior_logprobs[3] = -0.01f;
    }
  }
  int64_t trained = 0, trained_perturbed = 0;
  auto a = StepOnce(episodes, &trained);
  auto b = StepOnce(perturbed, &trained_perturbed);
  CHECK(trained == 4 * 4 * 2);
  CHECK(trained_perturbed == trained);
  CHECK(SameWeights(*a, *b));
  // The same perturbation on tokens the model produced does move the step
  // (so the check above can fail).
  auto single_turn = perturbed;
  for (auto& g : single_turn) {
    for (auto& c : g.completions) c.trained.clear();
  }
  int64_t all_tokens = 0;
  auto c = StepOnce(single_turn, &all_tokens);
  CHECK(all_tokens == 4 * 4 * 4);
  CHECK_FALSE(SameWeights(*a, *c));
  // A flag per token is required.
  auto wrong = episodes;
  wrong[0].completions[0].trained = {1, 0};
  auto trainer = GrpoTrainer::Create(**initial, 0, GrpoTrainerOptions());
  REQUIRE(trainer.ok());
  auto refused = (*trainer)->Step(wrong);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("4 tokens but 2 trained flags"));
}

TEST_CASE("groups with equal rewards leave the weights unchanged") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 12);
  REQUIRE(initial.ok());
  auto trainer = GrpoTrainer::Create(**initial, 5, GrpoTrainerOptions());
  REQUIRE(trainer.ok());
  auto snapshot = (*trainer)->SnapshotWeights();
  REQUIRE(snapshot.ok());
  auto groups = Generate(*snapshot, 4, 3);
  for (auto& g : groups) {
    for (auto& c : g.completions) {
      c.reward = 0.5;
      c.min_policy_version = 3;
    }
  }
  auto stats = (*trainer)->Step(groups);
  REQUIRE(stats.ok());
  CHECK(stats->loss.advantage_mean == 0.0);
  CHECK(stats->grad_norm == 0.0);
  CHECK(stats->staleness == std::vector<int64_t>(16, 2));
  auto after = (*trainer)->SnapshotWeights();
  REQUIRE(after.ok());
  for (const auto& [name, tensor] : (*snapshot)->tensors()) {
    INFO(name);
    CHECK(torch::equal(tensor, (*after)->tensors().at(name)));
  }
}

}  // namespace
}  // namespace tandem::trainer

namespace tandem::trainer {
namespace {

// Every tensor of `a` equals the same tensor of `b`, and is finite.
void CheckSameAndFinite(const model::ModelWeights& a,
                        const model::ModelWeights& b) {
  for (const auto& [name, tensor] : a.tensors()) {
    INFO(name);
    CHECK(torch::equal(tensor, b.tensors().at(name)));
    CHECK(torch::isfinite(tensor).all().item<bool>());
  }
}

TEST_CASE(
    "a NaN log-prob or reward skips the step: weights unchanged and "
    "finite, no new version, the next clean step trains") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 13);
  REQUIRE(initial.ok());
  GrpoTrainerOptions options;
  options.lr = 1e-2;
  auto trainer = GrpoTrainer::Create(**initial, 5, options);
  REQUIRE(trainer.ok());
  auto before = (*trainer)->SnapshotWeights();
  REQUIRE(before.ok());
  const std::vector<ScoredPromptGroup> clean = Generate(*before, 8, 4);
  std::vector<ScoredPromptGroup> poisoned = clean;
  // A completion whose group has a reward signal, so it is forwarded.
  ScoredCompletion* target = nullptr;
  for (auto& group : poisoned) {
    for (auto& c : group.completions) {
      if (c.reward != group.completions.front().reward) target = &c;
    }
  }
  REQUIRE(target != nullptr);
  std::string quantity;
  SECTION("NaN behavior log-prob") {
    target->behavior_logprobs[0] = std::numeric_limits<float>::quiet_NaN();
    quantity = "loss";
  }
  SECTION("NaN reward, so NaN advantages") {
    target->reward = std::numeric_limits<double>::quiet_NaN();
    quantity = "reward";
  }
  auto skipped = (*trainer)->Step(poisoned);
  INFO(skipped.status().ToString());
  REQUIRE(skipped.ok());
  CHECK(skipped->skipped());
  CHECK(skipped->nonfinite == quantity);
  CHECK(skipped->policy_version == 5);
  CHECK((*trainer)->policy_version() == 5);
  CHECK((*trainer)->step() == 0);
  for (const auto& [name, grad] : (*trainer)->GradientsForTest()) {
    INFO(name);
    CHECK((!grad.defined() || grad.abs().sum().item<double>() == 0.0));
  }
  auto after = (*trainer)->SnapshotWeights();
  REQUIRE(after.ok());
  CheckSameAndFinite(**before, **after);

  // The optimizer state was not touched: the clean batch now trains as the
  // first step.
  auto trained = (*trainer)->Step(clean);
  REQUIRE(trained.ok());
  CHECK_FALSE(trained->skipped());
  CHECK(trained->policy_version == 6);
  CHECK((*trainer)->step() == 1);
  auto moved = (*trainer)->SnapshotWeights();
  REQUIRE(moved.ok());
  bool changed = false;
  for (const auto& [name, tensor] : (*moved)->tensors()) {
    CHECK(torch::isfinite(tensor).all().item<bool>());
    changed |= !torch::equal(tensor, (*before)->tensors().at(name));
  }
  CHECK(changed);
}

TEST_CASE("weights with a NaN are never snapshotted for publishing") {
  auto initial = model::RandomInit(model::testing::TinyQwen2Config(), 14);
  REQUIRE(initial.ok());
  const std::string name = (*initial)->tensors().begin()->first;
  {
    torch::NoGradGuard no_grad;
    (*initial)->tensors().at(name).view({-1})[3] =
        std::numeric_limits<float>::quiet_NaN();
  }
  auto trainer = GrpoTrainer::Create(**initial, 0, GrpoTrainerOptions());
  REQUIRE(trainer.ok());
  auto snapshot = (*trainer)->SnapshotWeights();
  REQUIRE_FALSE(snapshot.ok());
  CHECK(snapshot.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(snapshot.status().message()),
             Catch::Contains("weight '" + name + "' has 1 NaN and 0 infinite"));
}

}  // namespace
}  // namespace tandem::trainer
