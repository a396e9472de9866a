// The float32 versions the trainer daemon stores for its rollout workers
// are its master weights byte for byte, and a stored version keeps its
// bytes when the next step changes the weights. Publishing flattens the
// master weights directly (no snapshot copy first), so the second property
// is what would break if the store ever aliased them.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

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

// The stored full version `version`, unflattened into tensors by name.
std::map<std::string, at::Tensor> StoredTensors(
    const Trainer& trainer, const weights::FlatWeightLayout& layout,
    const model::ModelConfig& config, uint64_t version) {
  auto stored = trainer.WeightStoreForTest().Get(
      version, tandem::v1::WEIGHT_PAYLOAD_KIND_FULL);
  REQUIRE(stored.ok());
  REQUIRE(stored->manifest.policy_version() == version);
  auto weights = weights::UnflattenModel(config, layout, *stored->bytes);
  REQUIRE(weights.ok());
  return (*weights)->tensors();
}

bool SameTensors(const std::map<std::string, at::Tensor>& a,
                 const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || !torch::equal(t, it->second)) return false;
  }
  return true;
}

TEST_CASE("float32 versions are the master weights, and keep their bytes") {
  model::testing::TempDir dir;
  TrainerConfig config;  // the built-in model, float32
  config.checkpoint_dir = dir.File("checkpoints");
  config.checkpoint_on_stop = false;
  config.weight_broadcast = false;
  config.lr = 1e-2;
  auto trainer = Trainer::Create(config);
  INFO(trainer.status().ToString());
  REQUIRE(trainer.ok());
  const GrpoTrainer& grpo = (*trainer)->GrpoTrainerForTest();
  auto initial = grpo.SnapshotWeights();
  REQUIRE(initial.ok());
  REQUIRE((*initial)->dtype() == at::kFloat);
  const model::ModelConfig model_config = (*initial)->config();
  auto layout = weights::LayoutForModel(**initial);
  REQUIRE(layout.ok());

  std::vector<std::map<std::string, at::Tensor>> after_step;
  for (int step = 0; step < 3; ++step) {
    auto snapshot = grpo.SnapshotWeights();
    REQUIRE(snapshot.ok());
    auto groups = testing::SampleScoredGroups(
        *snapshot,
        {{task::kArithBosId, 1, 2, 10, 3, 4, 12},
         {task::kArithBosId, 7, 10, 5, 12}},
        {.n = 8, .seed = static_cast<uint64_t>(1 + step), .max_context = 64});
    REQUIRE(groups.ok());
    auto stats = (*trainer)->TrainAndStoreForTest(*groups);
    REQUIRE(stats.ok());
    REQUIRE(stats->policy_version == static_cast<uint64_t>(step + 1));
    CHECK(stats->grad_norm > 0.0);
    auto master = grpo.SnapshotWeights();
    REQUIRE(master.ok());
    after_step.push_back((*master)->tensors());
    // This version's bytes are the weights after its step.
    CHECK(SameTensors(
        StoredTensors(**trainer, *layout, model_config, stats->policy_version),
        after_step.back()));
  }
  // Every step moved the weights, and the earlier versions still hold
  // their own step's bytes.
  CHECK_FALSE(SameTensors(after_step[0], (*initial)->tensors()));
  for (size_t v = 1; v < after_step.size(); ++v) {
    INFO("version " << v);
    CHECK_FALSE(SameTensors(after_step[v], after_step[v - 1]));
    CHECK(SameTensors(StoredTensors(**trainer, *layout, model_config, v),
                      after_step[v - 1]));
  }
}

}  // namespace
}  // namespace tandem::trainer
