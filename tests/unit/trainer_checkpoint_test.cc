// Trainer checkpoints (services/trainer/checkpoint*): a trainer resumed
// from a checkpoint takes exactly the step an uninterrupted one takes;
// damaged or missing checkpoint files fail with errors that name them; the
// directory keeps the newest `keep` checkpoints behind an atomic `latest`;
// the Hugging Face export loads with LoadHfModel; resumed policy versions
// follow the coordinator's numbering.

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "prometheus/registry.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/tools/checkpoint_export.h"
#include "services/trainer/checkpoint_manager.h"
#include "services/trainer/rl/grpo_trainer.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;

// A fresh empty directory under the system temp dir, removed on scope exit.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("tandem-ckpt-test-" + std::to_string(::getpid()) + "-" +
             std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// A fixed synthetic batch, different for every `step`: two groups of four
// completions with spread rewards and off-policy behavior log-probs, so the
// PPO ratio, clipping and advantages all take part.
std::vector<ScoredPromptGroup> Batch(int step) {
  std::vector<ScoredPromptGroup> groups(2);
  for (int g = 0; g < 2; ++g) {
    groups[g].prompt = {2 + g, 5 + step % 7, 7, 11 + g};
    for (int c = 0; c < 4; ++c) {
      ScoredCompletion completion;
      for (int t = 0; t < 3 + c % 2; ++t) {
        completion.tokens.push_back((13 * step + 7 * g + 5 * c + 3 * t) % 97);
        completion.behavior_logprobs.push_back(-4.0f - 0.25f * ((c + t) % 3));
      }
      completion.reward = (c + g + step) % 3 == 0 ? 1.0 : 0.1 * c;
      groups[g].completions.push_back(std::move(completion));
    }
  }
  return groups;
}

GrpoTrainerOptions Options() {
  GrpoTrainerOptions o;
  o.lr = 3e-3;
  o.warmup_steps = 5;  // the schedule position matters at every step here
  o.weight_decay = 0.01;
  return o;
}

std::unique_ptr<GrpoTrainer> NewTrainer() {
  auto initial = model::RandomInit(model::testing::TinyQwen3Config(), 21);
  REQUIRE(initial.ok());
  auto trainer = GrpoTrainer::Create(**initial, 0, Options());
  REQUIRE(trainer.ok());
  return std::move(trainer).value();
}

void TakeSteps(GrpoTrainer* trainer, int from, int to) {
  for (int step = from; step < to; ++step) {
    auto stats = trainer->Step(Batch(step));
    REQUIRE(stats.ok());
  }
}

CheckpointWriteOptions WriteOptions(const std::string& dir) {
  CheckpointWriteOptions o;
  o.dir = dir;
  o.training_config_json = R"({"lr":0.003})";
  return o;
}

// A trainer resumed from `path` the way the daemon does it: weights from
// hf/, then optimizer state, step, version and RNG.
std::unique_ptr<GrpoTrainer> Resume(const std::string& path,
                                    bool restore_state = true) {
  auto checkpoint = ReadCheckpoint(path);
  REQUIRE(checkpoint.ok());
  auto weights = model::LoadHfModel(checkpoint->hf_dir);
  REQUIRE(weights.ok());
  auto trainer = GrpoTrainer::Create(**weights, 0, Options());
  REQUIRE(trainer.ok());
  if (restore_state) {
    REQUIRE(RestoreFromCheckpoint(*checkpoint, trainer->get()).ok());
  }
  return std::move(trainer).value();
}

// Largest absolute difference between two trainers' weights.
double MaxWeightDifference(const GrpoTrainer& a, const GrpoTrainer& b) {
  auto wa = a.SnapshotWeights();
  auto wb = b.SnapshotWeights();
  REQUIRE(wa.ok());
  REQUIRE(wb.ok());
  double max = 0;
  for (const auto& [name, tensor] : (*wa)->tensors()) {
    max = std::max(
        max, (tensor - (*wb)->tensors().at(name)).abs().max().item<double>());
  }
  return max;
}

std::string WriteAt(const GrpoTrainer& trainer, const std::string& dir) {
  auto written = WriteCheckpoint(trainer, WriteOptions(dir));
  REQUIRE(written.ok());
  return written->path;
}

TEST_CASE("the steps after a resume equal the uninterrupted run's steps") {
  TempDir dir;
  auto uninterrupted = NewTrainer();
  TakeSteps(uninterrupted.get(), 0, 3);
  const std::string path = WriteAt(*uninterrupted, dir.str());
  CHECK(path == (dir.path() / "step-3").string());
  TakeSteps(uninterrupted.get(), 3, 6);

  auto resumed = Resume(path);
  CHECK(resumed->step() == 3);
  CHECK(resumed->policy_version() == 3);
  TakeSteps(resumed.get(), 3, 6);
  CHECK(resumed->step() == 6);
  CHECK(resumed->policy_version() == 6);
  const double difference = MaxWeightDifference(*uninterrupted, *resumed);
  INFO("max |w_uninterrupted - w_resumed| = " << difference);
  CHECK(difference <= 1e-6);

  // The comparison is sensitive: the same weights without the optimizer
  // state and schedule position take visibly different steps.
  auto weights_only = Resume(path, /*restore_state=*/false);
  TakeSteps(weights_only.get(), 3, 6);
  CHECK(MaxWeightDifference(*uninterrupted, *weights_only) > 1e-4);
}

TEST_CASE("a resumed trainer continues the CPU random stream") {
  TempDir dir;
  auto trainer = NewTrainer();
  TakeSteps(trainer.get(), 0, 1);
  torch::manual_seed(1234);
  const std::string path = WriteAt(*trainer, dir.str());
  const at::Tensor expected = torch::rand({8});
  torch::manual_seed(99);  // anything else
  auto resumed = Resume(path);
  CHECK(torch::equal(torch::rand({8}), expected));
}

TEST_CASE("the checkpoint directory keeps the newest checkpoints") {
  TempDir dir;
  auto trainer = NewTrainer();
  CheckpointWriteOptions options = WriteOptions(dir.str());
  options.keep = 2;
  for (int step = 0; step < 3; ++step) {
    TakeSteps(trainer.get(), step, step + 1);
    auto written = WriteCheckpoint(*trainer, options);
    REQUIRE(written.ok());
    CHECK(written->bytes > 0);
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step-2", "step-3"});
  auto latest = FindLatestCheckpoint(dir.str());
  REQUIRE(latest.ok());
  CHECK(fs::equivalent(*latest, dir.path() / "step-3"));
}

// Names of the entries of `dir`, sorted.
std::vector<std::string> Entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE("a pinned checkpoint survives rotation and is not counted in keep") {
  TempDir dir;
  auto trainer = NewTrainer();
  TakeSteps(trainer.get(), 0, 1);
  const std::string pinned = WriteAt(*trainer, dir.str());
  REQUIRE(PinCheckpoint(pinned, "asked for by an operator").ok());
  for (int step = 1; step < 5; ++step) {
    TakeSteps(trainer.get(), step, step + 1);
    WriteAt(*trainer, dir.str());  // keep 2
  }
  CHECK(Entries(dir.path()) ==
        std::vector<std::string>{"latest", "step-1", "step-4", "step-5"});
  auto loaded = ReadCheckpoint(pinned);
  REQUIRE(loaded.ok());
  CHECK(loaded->state.step == 1);
  auto latest = FindLatestCheckpoint(dir.str());
  REQUIRE(latest.ok());
  CHECK(fs::equivalent(*latest, dir.path() / "step-5"));

  // A new run writing the same step keeps the pinned one under another name.
  auto new_run = NewTrainer();
  TakeSteps(new_run.get(), 0, 1);
  const std::string replacement = WriteAt(*new_run, dir.str());
  CHECK(replacement == pinned);
  CHECK_FALSE(fs::exists(fs::path(replacement) / kCheckpointPinFile));
  int kept = 0;
  for (const std::string& name : Entries(dir.path())) {
    if (name.rfind("pinned-step-1-", 0) != 0) continue;
    ++kept;
    auto old = ReadCheckpoint((dir.path() / name).string());
    REQUIRE(old.ok());
    CHECK(old->state.step == 1);
    CHECK(fs::exists(dir.path() / name / kCheckpointPinFile));
  }
  CHECK(kept == 1);

  auto missing = PinCheckpoint((dir.path() / "step-77").string(), "x");
  CHECK(absl::IsNotFound(missing));
  CHECK(missing.message().find("step-77") != std::string::npos);
}

TEST_CASE("a trainer that starts over never prunes its own new checkpoint") {
  // An older run left step-2 and step-3; a new run (not resuming) writes
  // step-1 with keep 2, then step-2 over the old one.
  TempDir dir;
  auto old_run = NewTrainer();
  TakeSteps(old_run.get(), 0, 2);
  WriteAt(*old_run, dir.str());
  TakeSteps(old_run.get(), 2, 3);
  WriteAt(*old_run, dir.str());
  auto new_run = NewTrainer();
  TakeSteps(new_run.get(), 0, 1);
  const std::string first = WriteAt(*new_run, dir.str());
  CHECK(fs::exists(fs::path(first) / "trainer_state.json"));
  auto latest = FindLatestCheckpoint(dir.str());
  REQUIRE(latest.ok());
  CHECK(fs::equivalent(*latest, first));
  TakeSteps(new_run.get(), 1, 2);
  const std::string second = WriteAt(*new_run, dir.str());
  auto resumed = Resume(second);
  CHECK(MaxWeightDifference(*resumed, *new_run) == 0.0);
}

TEST_CASE("the exported policy loads as a Hugging Face model") {
  TempDir dir;
  auto trainer = NewTrainer();
  TakeSteps(trainer.get(), 0, 2);
  CheckpointWriteOptions options = WriteOptions(dir.str());
  options.builtin_tokenizer = true;
  REQUIRE(WriteCheckpoint(*trainer, options).ok());
  // <checkpoint_dir>/latest/hf is the stable path of the newest export.
  const std::string hf = (dir.path() / "latest" / "hf").string();
  CHECK(fs::exists(hf + "/tokenizer.json"));
  auto loaded = model::LoadHfModel(hf);
  REQUIRE(loaded.ok());
  auto current = trainer->SnapshotWeights();
  REQUIRE(current.ok());
  for (const auto& [name, tensor] : (*current)->tensors()) {
    INFO(name);
    CHECK(torch::equal(tensor, (*loaded)->tensors().at(name)));
  }
  // tandem-trainer export: bfloat16 copy elsewhere, tokenizer included.
  ExportOptions export_options;
  export_options.checkpoint = dir.str();
  export_options.output = (dir.path() / "export").string();
  export_options.dtype = "bfloat16";
  auto exported = ExportCheckpoint(export_options);
  REQUIRE(exported.ok());
  CHECK(fs::equivalent(*exported, dir.path() / "step-2"));
  auto bf16 = model::LoadHfModel(export_options.output);
  REQUIRE(bf16.ok());
  CHECK((*bf16)->dtype() == at::kBFloat16);
  CHECK(fs::exists(export_options.output + "/tokenizer.json"));
}

// Overwrites one byte in the middle of `path`.
void FlipByte(const fs::path& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  const auto size = fs::file_size(path);
  f.seekg(static_cast<std::streamoff>(size / 2));
  char c = 0;
  f.read(&c, 1);
  f.seekp(static_cast<std::streamoff>(size / 2));
  c = static_cast<char>(c ^ 0x5a);
  f.write(&c, 1);
}

TEST_CASE("damaged or missing checkpoint files give errors naming them") {
  TempDir dir;
  auto trainer = NewTrainer();
  TakeSteps(trainer.get(), 0, 1);
  const fs::path path = WriteAt(*trainer, dir.str());

  SECTION("a flipped byte in the weights") {
    FlipByte(path / "hf" / "model.safetensors");
    auto read = ReadCheckpoint(path.string());
    REQUIRE_FALSE(read.ok());
    CHECK(read.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(read.status().message()),
               Catch::Contains((path / "hf" / "model.safetensors").string()) &&
                   Catch::Contains("crc32c"));
  }
  SECTION("a truncated optimizer file") {
    fs::resize_file(path / "optimizer.safetensors", 100);
    auto read = ReadCheckpoint(path.string());
    REQUIRE_FALSE(read.ok());
    CHECK_THAT(std::string(read.status().message()),
               Catch::Contains((path / "optimizer.safetensors").string()) &&
                   Catch::Contains("truncated"));
  }
  SECTION("a missing weights file") {
    fs::remove(path / "hf" / "model.safetensors");
    auto read = ReadCheckpoint(path.string());
    REQUIRE_FALSE(read.ok());
    CHECK_THAT(std::string(read.status().message()),
               Catch::Contains((path / "hf" / "model.safetensors").string()) &&
                   Catch::Contains("missing"));
  }
  SECTION("a missing or garbled trainer_state.json") {
    const fs::path state = path / "trainer_state.json";
    SECTION("missing") { fs::remove(state); }
    SECTION("garbled") { std::ofstream(state) << "{\"step\": 3,"; }
    auto read = ReadCheckpoint(path.string());
    REQUIRE_FALSE(read.ok());
    CHECK(read.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(read.status().message()),
               Catch::Contains(state.string()));
  }
  SECTION("latest naming a checkpoint that is gone") {
    fs::remove_all(path);
    auto latest = FindLatestCheckpoint(dir.str());
    REQUIRE_FALSE(latest.ok());
    CHECK(latest.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(latest.status().message()),
               Catch::Contains((dir.path() / "latest").string()) &&
                   Catch::Contains("step-1"));
  }
  SECTION("a directory without checkpoints is NotFound (a fresh start)") {
    TempDir empty;
    CHECK(absl::IsNotFound(FindLatestCheckpoint(empty.str()).status()));
    CHECK(absl::IsNotFound(
        FindLatestCheckpoint(empty.str() + "/never-created").status()));
  }
  SECTION("the daemon refuses to start over when latest is corrupt") {
    FlipByte(path / "optimizer.safetensors");
    prometheus::Registry registry;
    CheckpointPolicy policy;
    policy.dir = dir.str();
    CheckpointManager manager(policy, &registry);
    auto resume = manager.FindResumePoint();
    REQUIRE_FALSE(resume.ok());
    CHECK_THAT(std::string(resume.status().message()),
               Catch::Contains("optimizer.safetensors"));
  }
}

TEST_CASE("a checkpoint saved on request is pinned, also when unchanged") {
  TempDir dir;
  prometheus::Registry registry;
  CheckpointPolicy policy;
  policy.dir = dir.str();
  policy.keep = 1;
  CheckpointManager manager(policy, &registry);
  auto trainer = NewTrainer();
  TakeSteps(trainer.get(), 0, 1);
  auto periodic = manager.Save(*trainer);  // not pinned
  REQUIRE(periodic.ok());
  CHECK_FALSE(fs::exists(fs::path(periodic->path) / kCheckpointPinFile));
  // Unchanged since: the same checkpoint is returned, and now pinned.
  auto requested = manager.Save(*trainer, "requested");
  REQUIRE(requested.ok());
  CHECK(requested->path == periodic->path);
  CHECK(fs::exists(fs::path(requested->path) / kCheckpointPinFile));
  TakeSteps(trainer.get(), 1, 3);
  REQUIRE(manager.Save(*trainer).ok());
  TakeSteps(trainer.get(), 3, 4);
  REQUIRE(manager.Save(*trainer).ok());
  CHECK(Entries(dir.path()) ==
        std::vector<std::string>{"latest", "step-1", "step-4"});
}

TEST_CASE("a resumed trainer adopts the coordinator's version numbering") {
  TempDir dir;
  prometheus::Registry registry;
  CheckpointPolicy policy;
  policy.dir = dir.str();
  policy.every_steps = 2;
  CheckpointManager manager(policy, &registry);
  auto trainer = NewTrainer();
  for (int step = 0; step < 3; ++step) {
    TakeSteps(trainer.get(), step, step + 1);
    auto written = manager.MaybeSave(*trainer);
    REQUIRE(written.ok());
    CHECK(written->has_value() == (trainer->step() == 2));
  }
  // Stopping after step 3 writes step-3; stopping again writes nothing.
  auto on_stop = manager.SaveOnStop(*trainer);
  REQUIRE(on_stop.ok());
  REQUIRE(on_stop->has_value());
  CHECK((*on_stop)->step == 3);
  CHECK(manager.last_checkpoint() == (dir.path() / "step-3").string());
  auto again = manager.SaveOnStop(*trainer);
  REQUIRE(again.ok());
  CHECK_FALSE(again->has_value());

  prometheus::Registry restarted_registry;
  CheckpointManager restarted(policy, &restarted_registry);
  auto point = restarted.FindResumePoint();
  REQUIRE(point.ok());
  REQUIRE(point->has_value());
  auto resumed = Resume((*point)->path);
  CHECK(resumed->policy_version() == 3);
  // Coordinator at the same version: nothing changes.
  restarted.ReconcileVersion(3, true, resumed.get());
  CHECK(resumed->policy_version() == 3);
  // Versions were published after the checkpoint (a kill, not a stop).
  restarted.ReconcileVersion(5, true, resumed.get());
  CHECK(resumed->policy_version() == 5);
  auto stats = resumed->Step(Batch(3));
  REQUIRE(stats.ok());
  CHECK(stats->policy_version == 6);
  CHECK(resumed->step() == 4);  // the schedule continues from the checkpoint

  // A checkpoint past version 0 while the coordinator has none is another
  // run's: not resumed. Unreachable coordinator: resumed.
  auto fresh_coordinator =
      restarted.FindResumePoint([]() -> absl::StatusOr<uint64_t> { return 0; });
  REQUIRE(fresh_coordinator.ok());
  CHECK_FALSE(fresh_coordinator->has_value());
  auto same_run =
      restarted.FindResumePoint([]() -> absl::StatusOr<uint64_t> { return 3; });
  REQUIRE(same_run.ok());
  CHECK(same_run->has_value());
  auto unreachable =
      restarted.FindResumePoint([]() -> absl::StatusOr<uint64_t> {
        return absl::UnavailableError("connection refused");
      });
  REQUIRE(unreachable.ok());
  CHECK(unreachable->has_value());

  // No checkpoint at all while the coordinator has versions.
  auto fresh = NewTrainer();
  restarted.ReconcileVersion(7, false, fresh.get());
  CHECK(fresh->policy_version() == 7);
}

// Not run by ctest: `trainer_checkpoint_test "[.bench]"` prints the time
// and size of writing, verifying and restoring a checkpoint of a ~70M
// parameter model (fp32 weights + AdamW moments, ~0.85 GB).
TEST_CASE("checkpoint write and resume cost at 70M parameters", "[.bench]") {
  model::ModelConfig config = model::testing::TinyQwen3Config();
  config.vocab_size = 32000;
  config.hidden_size = 512;
  config.intermediate_size = 1408;
  config.num_hidden_layers = 12;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 4;
  config.head_dim = 64;
  auto initial = model::RandomInit(config, 3);
  REQUIRE(initial.ok());
  auto trainer = GrpoTrainer::Create(**initial, 0, Options());
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->Step(Batch(0)).ok());
  TempDir dir;
  auto written = WriteCheckpoint(**trainer, WriteOptions(dir.str()));
  REQUIRE(written.ok());
  const absl::Time read_start = absl::Now();
  auto read = ReadCheckpoint(written->path);
  REQUIRE(read.ok());
  auto weights = model::LoadHfModel(read->hf_dir);
  REQUIRE(weights.ok());
  auto resumed = GrpoTrainer::Create(**weights, 0, Options());
  REQUIRE(resumed.ok());
  REQUIRE(RestoreFromCheckpoint(*read, resumed->get()).ok());
  const double read_seconds = absl::ToDoubleSeconds(absl::Now() - read_start);
  std::printf(
      "parameters %lld, checkpoint %.1f MB: write %.2f s (%.0f MB/s), "
      "verify + load + restore %.2f s\n",
      static_cast<long long>((*initial)->num_parameters()),
      written->bytes / 1e6, written->seconds,
      written->bytes / 1e6 / written->seconds, read_seconds);
}

}  // namespace
}  // namespace tandem::trainer
