// The KL penalty to a frozen reference policy (training.kl_beta,
// training.reference_model): with the starting weights as reference the KL
// is 0 at the first step and grows as the policy learns; a step whose only
// gradient is the KL term (zero advantages) pulls the policy toward the
// reference; a missing or incompatible reference is a config error that
// names the field and the file.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config/config_schema.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_loader.h"
#include "common/model/model_weights.h"
#include "services/trainer/reference_policy.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "services/trainer/trainer.h"
#include "services/trainer/trainer_config.h"
#include "tests/unit/grpo_test_util.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

using ::Catch::Matchers::Contains;

std::vector<std::vector<int32_t>> Prompts() { return testing::FourPrompts(); }

// `n` samples per prompt from `weights`; reward 1 for an even first token.
std::vector<ScoredPromptGroup> Generate(
    std::shared_ptr<model::ModelWeights> weights, int n, uint64_t seed) {
  auto groups = testing::SampleScoredGroups(std::move(weights), Prompts(),
                                            {.n = n, .seed = seed});
  REQUIRE(groups.ok());
  return *std::move(groups);
}

// `spread`: a larger init than transformers' (as model_test's), so that two
// random models' next-token distributions differ clearly.
std::shared_ptr<model::ModelWeights> Weights(uint64_t seed,
                                             bool spread = false) {
  model::RandomInitOptions init;
  if (spread) init = {.stddev = 0.15, .norm_noise = 0.2};
  auto weights =
      model::RandomInit(model::testing::TinyQwen2Config(), seed, init);
  REQUIRE(weights.ok());
  return *weights;
}

TEST_CASE("KL to the starting weights is 0 at the first step, then grows") {
  const auto initial = Weights(21);
  GrpoTrainerOptions options;
  options.lr = 1e-2;
  options.loss.kl_beta = 0.05;
  auto trainer = GrpoTrainer::Create(*initial, 0, options);
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->SetReferencePolicy(*initial).ok());
  CHECK((*trainer)->has_reference_policy());
  std::vector<double> kl;
  for (int step = 0; step < 6; ++step) {
    auto snapshot = (*trainer)->SnapshotWeights();
    REQUIRE(snapshot.ok());
    auto stats = (*trainer)->Step(Generate(*snapshot, 8, 1 + step));
    REQUIRE(stats.ok());
    CHECK(std::isfinite(stats->loss.loss));
    kl.push_back(stats->loss.kl_mean);
  }
  INFO("kl per step: " << kl[0] << " " << kl[1] << " ... " << kl.back());
  // Same float32 weights, same computation: exactly equal log-probs.
  CHECK(kl[0] == 0.0);
  CHECK(kl[1] > 0.0);
  CHECK(kl.back() > 1e-4);
}

TEST_CASE("a step with only the KL term moves log-probs toward the reference") {
  const auto reference = Weights(31, /*spread=*/true);
  // The policy starts elsewhere: other random weights, same vocabulary.
  const auto start = Weights(32, /*spread=*/true);
  auto groups = Generate(start, 4, 7);
  for (auto& g : groups) {
    for (auto& c : g.completions) c.reward = 1.0;  // advantages all 0
  }
  GrpoTrainerOptions options;
  options.lr = 1e-3;
  options.max_grad_norm = 1e9;
  SECTION("without the penalty the step changes nothing") {
    auto trainer = GrpoTrainer::Create(*start, 0, options);
    REQUIRE(trainer.ok());
    REQUIRE((*trainer)->SetReferencePolicy(*reference).ok());
    auto stats = (*trainer)->Step(groups);
    REQUIRE(stats.ok());
    CHECK(stats->grad_norm == 0.0);
    // Reference log-probs are still computed for the statistic.
    CHECK(stats->loss.kl_mean > 0.0);
  }
  SECTION("with it the KL and the log-prob gap shrink step by step") {
    options.loss.kl_beta = 1.0;
    auto trainer = GrpoTrainer::Create(*start, 0, options);
    REQUIRE(trainer.ok());
    REQUIRE((*trainer)->SetReferencePolicy(*reference).ok());
    std::vector<double> kl;
    for (int step = 0; step < 4; ++step) {
      auto stats = (*trainer)->Step(groups);
      REQUIRE(stats.ok());
      CHECK(stats->grad_norm > 0.0);
      CHECK(stats->loss.advantage_mean == 0.0);
      kl.push_back(stats->loss.kl_mean);
    }
    INFO("kl " << kl[0] << " " << kl[1] << " " << kl[2] << " " << kl[3]);
    CHECK(kl[0] > 0.01);
    for (size_t i = 1; i < kl.size(); ++i) CHECK(kl[i] < kl[i - 1]);
  }
}

TEST_CASE("kl_beta > 0 without a reference policy fails the step") {
  const auto initial = Weights(41);
  GrpoTrainerOptions options;
  options.loss.kl_beta = 0.1;
  auto trainer = GrpoTrainer::Create(*initial, 0, options);
  REQUIRE(trainer.ok());
  auto stats = (*trainer)->Step(Generate(initial, 2, 1));
  CHECK(absl::IsFailedPrecondition(stats.status()));
  CHECK_THAT(std::string(stats.status().message()),
             Contains("reference policy"));
}

TEST_CASE("a reference policy with another vocabulary is refused") {
  const auto initial = Weights(42);
  auto trainer = GrpoTrainer::Create(*initial, 0, GrpoTrainerOptions());
  REQUIRE(trainer.ok());
  model::ModelConfig other = model::testing::TinyQwen2Config();
  other.vocab_size = 50;
  auto reference = model::RandomInit(other, 1);
  REQUIRE(reference.ok());
  const absl::Status status = (*trainer)->SetReferencePolicy(**reference);
  CHECK(absl::IsInvalidArgument(status));
  CHECK_THAT(std::string(status.message()), Contains("vocab_size is 50"));
  CHECK(!(*trainer)->has_reference_policy());
}

TEST_CASE("training.kl_beta < 0 is a config error") {
  TrainerConfig config;
  config::ConfigSchema schema;
  RegisterFields(&schema, &config);
  const absl::Status parsed =
      schema.ApplyYamlText("training:\n  kl_beta: -0.5\n", "trainer.yaml");
  CHECK(!parsed.ok());
  CHECK_THAT(std::string(parsed.message()), Contains("training.kl_beta"));
  config.kl_beta = -0.5;  // set in code, past the schema
  const absl::Status validated = Validate(config);
  CHECK(absl::IsInvalidArgument(validated));
  CHECK_THAT(std::string(validated.message()), Contains("training.kl_beta"));
  config.kl_beta = 0.2;
  CHECK(Validate(config).ok());
}

TEST_CASE("the reference policy is loaded only when kl_beta > 0") {
  model::testing::TempDir dir;
  TrainerConfig config;
  config.reference_model = dir.File("absent");
  const model::ModelConfig policy = model::testing::TinyQwen2Config();
  SECTION("kl_beta 0: nothing is read") {
    auto loaded = LoadReferencePolicy(config, policy);
    REQUIRE(loaded.ok());
    CHECK(*loaded == nullptr);
  }
  SECTION("a missing directory names the field and the file") {
    config.kl_beta = 0.1;
    auto loaded = LoadReferencePolicy(config, policy);
    CHECK(absl::IsNotFound(loaded.status()));
    const std::string message(loaded.status().message());
    CHECK_THAT(message, Contains("training.reference_model"));
    CHECK_THAT(message, Contains(dir.File("absent") + "/config.json"));
  }
  SECTION("another vocabulary names the field, the file and both sizes") {
    config.kl_beta = 0.1;
    config.reference_model = dir.File("ref");
    REQUIRE(model::SaveHfModel(*Weights(5), config.reference_model).ok());
    model::ModelConfig smaller = policy;
    smaller.vocab_size = 64;
    auto loaded = LoadReferencePolicy(config, smaller);
    CHECK(absl::IsInvalidArgument(loaded.status()));
    const std::string message(loaded.status().message());
    CHECK_THAT(message, Contains("training.reference_model: " +
                                 dir.File("ref") + "/config.json"));
    CHECK_THAT(message, Contains("vocab_size 97 differs from the policy's 64"));
    // The same directory with the right vocabulary loads, in its dtype.
    auto ok = LoadReferencePolicy(config, policy);
    REQUIRE(ok.ok());
    REQUIRE(*ok != nullptr);
    CHECK((*ok)->config().vocab_size == 97);
  }
  SECTION("the default is the starting model.path (here the built-in one)") {
    config.kl_beta = 0.1;
    config.reference_model.clear();
    config.model_seed = 9;
    auto builtin = model::LoadModel("", 9, 0);
    REQUIRE(builtin.ok());
    const auto& expected = *builtin->decoder->weights();
    auto loaded = LoadReferencePolicy(config, expected.config());
    REQUIRE(loaded.ok());
    REQUIRE(*loaded != nullptr);
    for (const auto& [name, tensor] : expected.tensors()) {
      INFO(name);
      CHECK(torch::equal(tensor, (*loaded)->tensors().at(name)));
    }
  }
  SECTION("the trainer daemon refuses to start with a bad reference") {
    config.kl_beta = 0.1;
    config.checkpoint_dir = dir.File("checkpoints");
    config.weight_broadcast = false;
    auto trainer = Trainer::Create(config);
    CHECK(absl::IsNotFound(trainer.status()));
    CHECK_THAT(std::string(trainer.status().message()),
               Contains("training.reference_model: " + dir.File("absent")));
  }
}

}  // namespace
}  // namespace tandem::trainer
