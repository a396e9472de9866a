// The float32 versions the trainer daemon stores for its rollout workers
// are its master weights byte for byte, and a stored version keeps its
// bytes when the next step changes the weights. Publishing flattens the
// master weights directly (no snapshot copy first), so the second property
// is what would break if the store ever aliased them.
//
// Where the version goes from (issue 22 item 4): a CPU trainer publishes
// from host bytes only (no device copy, deltas found on the host). On a
// GPU (cases that skip with a "skipping" warning without one): the
// trainer's device copy is the stored version byte for byte, its deltas
// are found on the device with the host path's decision and bytes, and
// with 2 GPUs the device copy goes over NCCL into a device receiver on the
// other GPU bit for bit (SendPayload, the broadcast sender's route), and
// a rollout worker's subscriber on that GPU makes it live as views of its
// device buffer (weight_subscriber_broadcast_device.cc).

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/task/arith_tokenizer.h"
#include "common/weights/delta_publisher.h"
#include "common/weights/model_flattening.h"
#include "common/weights/tree_digest.h"
#include "services/trainer/trainer.h"
#include "tests/unit/grpo_test_util.h"
#include "tests/unit/model_test_util.h"

#if TANDEM_TEST_DEVICE_SYNC
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/model/decoder_model.h"

#include "common/weights/broadcast/broadcast_sender.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#include "services/rollout/weight_subscriber.h"
#include "services/rollout/weight_update_sources.h"
#include "tests/support/wait_for.h"
#endif

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

// A bfloat16 checkpoint of the built-in model's shape with the arithmetic
// tokenizer (the trainer publishes bfloat16, so versions may be deltas).
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
  model::SaveOptions options;
  options.tokenizer_dir = tokenizer_dir;
  const std::string path = dir.File("model");
  REQUIRE(model::SaveHfModel(**weights, path, options).ok());
  return path;
}

// A bfloat16 trainer on `device` ("cpu", "cuda:0").
std::unique_ptr<Trainer> Bf16Trainer(const model::testing::TempDir& dir,
                                     const std::string& path,
                                     const std::string& device,
                                     const std::string& tree_digest = "auto") {
  TrainerConfig config;
  config.model_path = path;
  config.device = device;
  config.weight_tree_digest = tree_digest;
  config.checkpoint_dir = dir.File("checkpoints");
  config.checkpoint_on_stop = false;
  config.weight_broadcast = false;
  config.lr = 2e-5;  // small bf16 changes: sparse enough for deltas
  auto trainer = Trainer::Create(config);
  INFO(trainer.status().ToString());
  REQUIRE(trainer.ok());
  return *std::move(trainer);
}

// One step on samples of the trainer's own policy; the published payloads.
weights::PublishedVersion Step(Trainer* trainer, uint64_t seed) {
  auto snapshot = trainer->GrpoTrainerForTest().SnapshotWeights();
  REQUIRE(snapshot.ok());
  auto cpu = (*snapshot)->To(at::Device(at::kCPU),
                             model::WeightDType::kFloat32);
  REQUIRE(cpu.ok());
  auto groups = testing::SampleScoredGroups(
      *cpu,
      {{task::kArithBosId, 1, 2, 10, 3, 4, 12},
       {task::kArithBosId, 7, 10, 5, 12}},
      {.n = 8, .seed = seed, .max_context = 64});
  REQUIRE(groups.ok());
  weights::PublishedVersion published;
  auto stats = trainer->TrainAndStoreForTest(*groups, &published);
  INFO(stats.status().ToString());
  REQUIRE(stats.ok());
  REQUIRE(published.full.manifest.policy_version() == stats->policy_version);
  return published;
}

TEST_CASE("a CPU trainer publishes from host bytes only") {
  model::testing::TempDir dir;
  auto trainer = Bf16Trainer(dir, WriteBf16Model(dir), "cpu");
  bool compared = false;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const weights::PublishedVersion published = Step(trainer.get(), seed);
    // No device copy: the broadcast sender takes the host path whatever
    // the group (SendPayload needs one for the device route).
    CHECK_FALSE(published.full_device.has_value());
    CHECK_FALSE(published.compared_on_device);
    compared = compared || published.density.has_value();
  }
  CHECK(compared);  // versions 2 and 3 were compared with their base
}

TEST_CASE(
    "weight_sync.tree_digest: manifests carry the tree root of the stored "
    "full bytes when on, none when off or auto on the CPU") {
  for (const std::string tree_digest : {"on", "off", "auto"}) {
    INFO("weight_sync.tree_digest " << tree_digest);
    model::testing::TempDir dir;
    auto trainer =
        Bf16Trainer(dir, WriteBf16Model(dir), "cpu", tree_digest);
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const weights::PublishedVersion published = Step(trainer.get(), seed);
      const std::string& tree = published.full.manifest.tree_sha256();
      if (tree_digest != "on") {
        CHECK(tree.empty());
        continue;
      }
      auto expected = weights::WeightTreeSha256(*published.full.bytes);
      REQUIRE(expected.ok());
      CHECK(tree == *expected);
      // A delta's manifest names the full buffer it produces: the same.
      if (published.delta) {
        CHECK(published.delta->manifest.tree_sha256() == tree);
      }
    }
  }
}

#if TANDEM_TEST_DEVICE_SYNC

bool CudaDevices(int n) {
  const int visible = torch::cuda::is_available()
                          ? static_cast<int>(torch::cuda::device_count())
                          : 0;
  if (visible >= n) return true;
  WARN("no " << n << " CUDA device(s) (" << visible << " visible): skipping");
  return false;
}

std::vector<uint8_t> DeviceBytes(const weights::DeviceFlat& d, int device) {
  at::Tensor t = torch::from_blob(
      const_cast<uint8_t*>(d.data), {static_cast<int64_t>(d.bytes)},
      torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, device));
  at::Tensor host = t.cpu();
  return std::vector<uint8_t>(host.data_ptr<uint8_t>(),
                              host.data_ptr<uint8_t>() + d.bytes);
}

TEST_CASE(
    "On a GPU the trainer's device copy is the stored version and its deltas "
    "are found on the device with the host path's bytes") {
  if (!CudaDevices(1)) return;
  model::testing::TempDir dir;
  auto trainer = Bf16Trainer(dir, WriteBf16Model(dir), "cuda:0");
  // The host path, fed the same stored versions.
  auto host = weights::DeltaPublisher::Create({true, 16, 0.5});
  REQUIRE(host.ok());
  int deltas = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const weights::PublishedVersion published = Step(trainer.get(), seed);
    INFO("version " << published.full.manifest.policy_version());
    REQUIRE(published.full_device.has_value());
    CHECK(DeviceBytes(*published.full_device, 0) == *published.full.bytes);
    auto on_host = host->Publish(published.full.manifest, published.full.bytes);
    REQUIRE(on_host.ok());
    CHECK(published.reason == on_host->reason);
    CHECK(published.changed_words == on_host->changed_words);
    CHECK(published.compared_on_device == on_host->density.has_value());
    REQUIRE(published.delta.has_value() == on_host->delta.has_value());
    if (published.delta.has_value()) {
      ++deltas;
      CHECK(*published.delta->bytes == *on_host->delta->bytes);
    }
  }
  INFO(deltas << " deltas");
  CHECK(deltas > 0);
}

TEST_CASE(
    "With 2 GPUs the trainer's device copy goes over NCCL into a device "
    "receiver on the other GPU bit for bit") {
  if (!CudaDevices(2)) return;
  model::testing::TempDir dir;
  auto trainer = Bf16Trainer(dir, WriteBf16Model(dir), "cuda:0");
  const weights::PublishedVersion published = Step(trainer.get(), 1);
  REQUIRE(published.full_device.has_value());
  const uint64_t bytes = published.full_device->bytes;

  auto server = weights::GlooRendezvousStore::Create("127.0.0.1", 0,
                                                     absl::Seconds(20));
  REQUIRE(server.ok());
  auto config = [&](int rank) {
    weights::NcclGroupConfig c;
    c.store_port = (*server)->port();
    c.rank = rank;
    c.world_size = 2;
    c.device = rank;
    c.key_prefix = "trainer-publish";
    c.timeout = absl::Seconds(30);
    c.bucket_bytes = 4096;  // several pieces per bucket
    return c;
  };
  absl::Status received_status;
  std::vector<uint8_t> received;
  std::thread worker([&] {
    c10::cuda::set_device(1);
    auto g = weights::NcclBroadcastGroup::Create(config(1));
    if (!g.ok()) {
      received_status = g.status();
      return;
    }
    at::Tensor staging = torch::zeros(
        {static_cast<int64_t>(bytes)},
        torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, 1));
    uint64_t round = 0;
    auto manifest = weights::ReceiveDeviceOverBroadcast(
        g->get(), staging.data_ptr<uint8_t>(), bytes, &round);
    received_status = manifest.status();
    at::Tensor host = staging.cpu();
    received.assign(host.data_ptr<uint8_t>(), host.data_ptr<uint8_t>() + bytes);
  });
  c10::cuda::set_device(0);
  absl::Status sent_status;
  weights::SentFrom from = weights::SentFrom::kHost;
  {
    auto g = weights::NcclBroadcastGroup::Create(config(0));
    sent_status = g.status();
    if (g.ok()) {
      sent_status = weights::SendPayload(
          g->get(), published.full, &*published.full_device,
          [](weights::BroadcastGroup* group,
             const tandem::v1::WeightManifest& manifest, const uint8_t* d,
             uint64_t n) {
            return weights::PublishDeviceOverBroadcast(group, manifest, d, n);
          },
          nullptr, absl::Now() + absl::Seconds(30), &from);
    }
  }
  worker.join();
  INFO("sender: " << sent_status.ToString()
                  << "; receiver: " << received_status.ToString());
  REQUIRE(sent_status.ok());
  REQUIRE(received_status.ok());
  CHECK(from == weights::SentFrom::kDevice);
  CHECK(received == *published.full.bytes);
}

TEST_CASE(
    "With 2 GPUs a rollout worker on GPU 1 receives the trainer's device "
    "publish into device memory and its live weights are views of it, bit "
    "for bit") {
  if (!CudaDevices(2)) return;
  model::testing::TempDir dir;
  const std::string path = WriteBf16Model(dir);
  auto trainer = Bf16Trainer(dir, path, "cuda:0");
  const weights::PublishedVersion published = Step(trainer.get(), 1);
  REQUIRE(published.full_device.has_value());
  const uint64_t version = published.full.manifest.policy_version();

  // The worker: the same checkpoint on cuda:1, a broadcast-mode subscriber
  // whose coordinator names an NCCL epoch of the trainer and itself.
  auto initial = model::LoadHfModel(
      path, {.device = at::Device(at::kCUDA, 1)});
  REQUIRE(initial.ok());
  auto decoder = std::make_shared<model::DecoderModel>(*initial);
  rollout::StagedWeightSource source(decoder);
  auto store = weights::GlooRendezvousStore::Create("127.0.0.1", 0,
                                                    absl::Seconds(30));
  REQUIRE(store.ok());
  tandem::v1::BroadcastGroup group;
  group.set_epoch(1);
  group.set_store_address(absl::StrCat("127.0.0.1:", (*store)->port()));
  group.set_key_prefix("trainer-publish-worker");
  group.add_member_ids("trainer-1");
  group.add_member_ids("worker-1");
  group.set_backend("nccl");
  group.set_first_policy_version(version);
  rollout::WeightSyncOptions options;
  options.mode = rollout::WeightSyncOptions::Mode::kBroadcast;
  options.member_id = [] { return std::string("worker-1"); };
  options.sync_weight_group = [&](const tandem::v1::SyncWeightGroupRequest&,
                                  tandem::v1::SyncWeightGroupResponse* r) {
    r->set_policy_version(version);
    *r->mutable_group() = group;
    return grpc::Status::OK;
  };
  options.timeout = absl::Seconds(30);
  options.pull_shared_memory = false;
  auto subscriber =
      rollout::WeightSubscriber::Create(decoder, &source, 0, options);
  REQUIRE(subscriber.ok());
  (*subscriber)->Start();

  c10::cuda::set_device(0);
  weights::NcclGroupConfig c;
  c.store_port = (*store)->port();
  c.rank = 0;
  c.world_size = 2;
  c.device = 0;
  c.key_prefix = group.key_prefix();
  c.timeout = absl::Seconds(30);
  absl::Status sent_status;
  weights::SentFrom from = weights::SentFrom::kHost;
  {
    auto g = weights::NcclBroadcastGroup::Create(c);
    sent_status = g.status();
    if (g.ok()) {
      sent_status = weights::SendPayload(
          g->get(), published.full, &*published.full_device,
          [](weights::BroadcastGroup* group,
             const tandem::v1::WeightManifest& manifest, const uint8_t* d,
             uint64_t n) {
            return weights::PublishDeviceOverBroadcast(group, manifest, d, n);
          },
          nullptr, absl::Now() + absl::Seconds(30), &from);
    }
    // The worker's receive must end before the group goes.
    tandem::testing::WaitFor(
        [&] { return source.ReadyVersion(0) == version; }, absl::Seconds(30));
  }
  (*subscriber)->Stop();
  INFO("sender: " << sent_status.ToString());
  REQUIRE(sent_status.ok());
  CHECK(from == weights::SentFrom::kDevice);
  REQUIRE(source.ReadyVersion(0) == version);
  REQUIRE(source.Commit(version).ok());
  // Views of one device buffer on GPU 1 (not a copy per tensor).
  const std::shared_ptr<model::ModelWeights> live = decoder->weights();
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (const auto& [name, t] : live->tensors()) {
    INFO(name);
    CHECK(t.device() == at::Device(at::kCUDA, 1));
    const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
    lo = std::min(lo, p);
    hi = std::max(hi, p + t.nbytes());
  }
  CHECK(hi - lo <= published.full.bytes->size());
  auto layout = weights::LayoutForModel(*live);
  REQUIRE(layout.ok());
  auto flat = weights::FlattenModel(*live, *layout);
  REQUIRE(flat.ok());
  CHECK(std::vector<uint8_t>((*flat)->begin(), (*flat)->end()) ==
        *published.full.bytes);
}

#endif  // TANDEM_TEST_DEVICE_SYNC

}  // namespace
}  // namespace tandem::trainer
