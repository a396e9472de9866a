// A bfloat16 Hugging Face checkpoint trains: the trainer daemon, started on
// a tiny bf16 model directory, takes steps on samples the bf16 rollout
// model generated (finite loss, weights move) and stores every new version
// in bfloat16, the layout the rollout workers built from the same directory,
// so they can load it. (Before the fix every step failed: the trainer
// published its float32 master weights into the workers' bf16 layout.)

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/task/arith_tokenizer.h"
#include "common/weights/model_flattening.h"
#include "services/trainer/trainer.h"
#include "tests/unit/grpo_test_util.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

// A bfloat16 checkpoint of the built-in model's shape with the arithmetic
// tokenizer, as `tandem-trainer export --dtype bfloat16` writes one.
std::string WriteBf16Model(const model::testing::TempDir& dir) {
  const std::string tokenizer_dir = dir.File("tokenizer");
  std::filesystem::create_directories(tokenizer_dir);
  REQUIRE(task::WriteArithTokenizer(tokenizer_dir + "/tokenizer.json").ok());
  model::ModelConfig config =
      model::BuiltinTinyModelConfig(task::kArithVocabSize);
  config.dtype = model::WeightDType::kBFloat16;
  config.bos_token_id = task::kArithBosId;
  config.eos_token_ids = {task::kArithEosId};
  auto weights = model::RandomInit(config, 3);
  REQUIRE(weights.ok());
  REQUIRE((*weights)->dtype() == at::kBFloat16);
  model::SaveOptions options;
  options.tokenizer_dir = tokenizer_dir;
  const std::string path = dir.File("model");
  REQUIRE(model::SaveHfModel(**weights, path, options).ok());
  return path;
}

// Samples of "12+34=" and "7+5=" from the bf16 model, as a rollout worker
// that loaded `path` produces them; reward 1 for an even first token.
std::vector<ScoredPromptGroup> Generate(const model::DecoderModel& rollout,
                                        uint64_t seed) {
  auto groups =
      testing::SampleScoredGroups(rollout.weights(),
                                  {{task::kArithBosId, 1, 2, 10, 3, 4, 12},
                                   {task::kArithBosId, 7, 10, 5, 12}},
                                  {.n = 8, .seed = seed, .max_context = 64});
  REQUIRE(groups.ok());
  return *std::move(groups);
}

TEST_CASE("a bfloat16 checkpoint trains and publishes bfloat16 versions") {
  model::testing::TempDir dir;
  const std::string path = WriteBf16Model(dir);
  // The rollout worker's view: the checkpoint as stored, and its layout.
  auto rollout_weights = model::LoadHfModel(path);
  REQUIRE(rollout_weights.ok());
  REQUIRE((*rollout_weights)->dtype() == at::kBFloat16);
  auto worker_layout = weights::LayoutForModel(**rollout_weights);
  REQUIRE(worker_layout.ok());
  model::DecoderModel rollout(*rollout_weights);

  TrainerConfig config;
  config.model_path = path;
  config.checkpoint_dir = dir.File("checkpoints");
  config.checkpoint_on_stop = false;
  config.weight_broadcast = false;
  config.lr = 1e-2;
  auto trainer = Trainer::Create(config);
  INFO(trainer.status().ToString());
  REQUIRE(trainer.ok());
  const GrpoTrainer& grpo = (*trainer)->GrpoTrainerForTest();
  // Training runs on float32 master weights.
  REQUIRE(grpo.policy().weights()->dtype() == at::kFloat);

  for (int step = 0; step < 3; ++step) {
    auto stats = (*trainer)->TrainAndStoreForTest(Generate(rollout, 1 + step));
    REQUIRE(stats.ok());
    CHECK(stats->policy_version == static_cast<uint64_t>(step + 1));
    CHECK(std::isfinite(stats->loss.loss));
    CHECK(std::isfinite(stats->grad_norm));
    CHECK(stats->grad_norm > 0.0);

    // The stored version is what a worker pulls: bfloat16 tensors in the
    // worker's own layout.
    auto stored = (*trainer)->WeightStoreForTest().Get(
        stats->policy_version, tandem::v1::WEIGHT_PAYLOAD_KIND_FULL);
    REQUIRE(stored.ok());
    CHECK(stored->manifest.policy_version() == stats->policy_version);
    REQUIRE(stored->manifest.tensors_size() > 0);
    for (const auto& tensor : stored->manifest.tensors()) {
      INFO(tensor.name());
      CHECK(tensor.dtype() == tandem::v1::DTYPE_BF16);
    }
    auto received = weights::UnflattenModel((*rollout_weights)->config(),
                                            *worker_layout, *stored->bytes);
    REQUIRE(received.ok());
    CHECK((*received)->dtype() == at::kBFloat16);
    // The worker goes on generating with it.
    REQUIRE(rollout.SwapWeights(*received).ok());
  }

  // The weights moved, also after rounding to bfloat16.
  int changed = 0;
  for (const auto& [name, before] : (*rollout_weights)->tensors()) {
    const at::Tensor after = rollout.weights()->tensors().at(name);
    CHECK(after.dtype() == at::kBFloat16);
    CHECK(torch::isfinite(after.to(torch::kFloat)).all().item<bool>());
    if (!torch::equal(before, after)) ++changed;
  }
  INFO(changed << " of " << (*rollout_weights)->tensors().size()
               << " tensors changed");
  CHECK(changed > 0);
}

}  // namespace
}  // namespace tandem::trainer
