// The rollout worker's device go-live, on the CPU: a WeightSubscriber
// whose pulls come by CUDA IPC (a real WeightServerService with a
// DeviceVersionRing, real gRPC on a loopback port) hands each copy from the
// sink to GoLiveFromStagedTensor and stages the live weights as views into
// that copy; the host staging follows. The "device" is host memory
// (host_ipc_sink.h: a seam of a device, not a mock of a daemon), so this
// is the code a GPU worker runs but for the CUDA calls
// (tests/gpu/cuda_ipc_test.cc runs those).

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/finite_weights.h"
#include "common/weights/model_flattening.h"
#include "common/weights/weight_digest.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "prometheus/registry.h"
#include "services/rollout/weight_subscriber.h"
#include "tests/support/wait_for.h"
#include "tests/unit/host_ipc_sink.h"
#include "tests/unit/model_test_util.h"
#include "tests/unit/weight_server_test_util.h"
#include "tests/unit/weights_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

using ::tandem::testing::WaitFor;
using weights::host_ipc::Bytes;

// The value of counter `name` whose labels include every one of `labels`.
double Counter(prometheus::Registry& registry, const std::string& name,
               const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      size_t matched = 0;
      for (const auto& [k, v] : labels) {
        for (const prometheus::ClientMetric::Label& label : m.label) {
          if (label.name == k && label.value == v) ++matched;
        }
      }
      if (matched == labels.size()) return m.counter.value;
    }
  }
  return 0;
}

// A worker (decoder on the CPU, engine, subscriber pulling with a sink
// that hands its copies over) and a trainer's weight server whose ring
// offers every version published with `device`.
class DeviceWorker {
 public:
  DeviceWorker()
      : config_(model::testing::TinyQwen2Config()),
        server_(&store_, {.cuda_ipc = &ring_}),
        sink_(&allocations_),
        metrics_(registry_) {
    auto initial = model::RandomInit(config_, 1);
    REQUIRE(initial.ok());
    decoder_ = std::make_shared<model::DecoderModel>(*initial);
    auto layout = weights::LayoutForModel(**initial);
    REQUIRE(layout.ok());
    layout_ = std::make_unique<weights::FlatWeightLayout>(*std::move(layout));
    source_ = std::make_unique<StagedWeightSource>(decoder_);
    engine_model_ = std::make_unique<engine::TorchEngineModel>(decoder_, 256);
    engine_ = std::make_unique<engine::Engine>(
        engine::EngineOptions{}, engine_model_.get(), source_.get(), 0);
    sink_.hand_over = true;
    WeightSyncOptions options;
    options.member_id = [] { return std::string("worker-1"); };
    const std::string address = server_.address();
    options.sync_weight_group = [address](const v1::SyncWeightGroupRequest&,
                                          v1::SyncWeightGroupResponse* r) {
      r->set_weight_server_address(address);
      return grpc::Status::OK;
    };
    options.pull_shared_memory = false;
    options.pull_cuda_ipc = &sink_;
    options.metrics = &metrics_;
    auto subscriber =
        WeightSubscriber::Create(decoder_, source_.get(), 0, options);
    REQUIRE(subscriber.ok());
    subscriber_ = *std::move(subscriber);
  }
  ~DeviceWorker() { subscriber_->Stop(); }

  void Start() { subscriber_->Start(); }

  // The flat bytes of new random weights (seed `seed`).
  Bytes Weights(uint64_t seed) {
    auto w = model::RandomInit(config_, seed);
    REQUIRE(w.ok());
    auto flat = weights::FlattenModel(**w, *layout_);
    REQUIRE(flat.ok());
    return Bytes((*flat)->begin(), (*flat)->end());
  }

  // Publishes `bytes` as FULL version `v` (and, with `delta_on`, as a
  // DELTA on that version's bytes), in the ring too when `device`.
  // `mangle` edits the manifest the server hands out.
  void Publish(uint64_t v, const Bytes& bytes, bool device,
               const Bytes* delta_on = nullptr,
               const std::function<void(v1::WeightManifest&)>& mangle = {}) {
    auto manifest = layout_->BuildManifest(bytes, v);
    REQUIRE(manifest.ok());
    manifest->set_anchor_version(delta_on == nullptr ? v : v - 1);
    if (mangle) mangle(*manifest);
    // The ring first, as the trainer does: a worker that sees the version
    // in the store finds it offered.
    if (device) {
      ring_.Put(allocations_.Allocate(v, bytes, ring_.deferred_frees()));
    }
    if (delta_on != nullptr) {
      auto delta = kernels::EncodeBf16Delta(kernels::AsWords(*delta_on),
                                            kernels::AsWords(bytes));
      REQUIRE(delta.ok());
      v1::WeightManifest dm = *manifest;
      dm.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
      dm.set_base_version(v - 1);
      REQUIRE(store_.Put(dm, std::make_shared<const Bytes>(*std::move(delta)))
                  .ok());
    } else {
      REQUIRE(store_.Put(*manifest, std::make_shared<const Bytes>(bytes)).ok());
    }
  }

  // Waits until `version` is staged, then runs a request so the engine
  // swaps it in at a step boundary.
  void GoLive(uint64_t version) {
    REQUIRE(WaitFor(
        [&] {
          return source_->ReadyVersion(engine_->policy_version()) == version;
        },
        absl::Seconds(20)));
    engine::SamplingParams params;
    params.max_tokens = 1;
    REQUIRE(engine_->Add("r" + std::to_string(version), {2, 3}, params).ok());
    while (!engine_->idle()) REQUIRE(engine_->Step().ok());
    REQUIRE(engine_->policy_version() == version);
    engine_->TakeFinished();
  }

  // The live weights' flat bytes.
  Bytes Live() {
    auto flat = weights::FlattenModel(*decoder_->weights(), *layout_);
    REQUIRE(flat.ok());
    return Bytes((*flat)->begin(), (*flat)->end());
  }

  // Whether every live tensor lies inside the sink's last copy.
  bool LiveInsideLastCopy() {
    const auto* base = sink_.last_handed_over();
    if (base == nullptr) return false;
    for (const auto& [name, tensor] : decoder_->weights()->tensors()) {
      const auto* p = static_cast<const uint8_t*>(tensor.data_ptr());
      if (p < base || p + tensor.nbytes() > base + layout_->total_bytes()) {
        return false;
      }
    }
    return true;
  }

  double Count(const std::string& name, const std::string& transport) {
    return Counter(registry_, name, {{"transport", transport}});
  }

  const weights::FlatWeightLayout& layout() const { return *layout_; }
  weights::host_ipc::HostIpcSink& sink() { return sink_; }
  engine::Engine& engine() { return *engine_; }
  StagedWeightSource& source() { return *source_; }
  WeightSubscriber& subscriber() { return *subscriber_; }

 private:
  const model::ModelConfig config_;
  weights::WeightStore store_{8};
  weights::host_ipc::HostAllocations allocations_;  // outlives the ring
  weights::DeviceVersionRing ring_{2};
  weights::testing::WeightServerLoopback server_;
  weights::host_ipc::HostIpcSink sink_;
  prometheus::Registry registry_;
  weights::WeightSyncMetrics metrics_;
  std::unique_ptr<weights::FlatWeightLayout> layout_;
  std::shared_ptr<model::DecoderModel> decoder_;
  std::unique_ptr<StagedWeightSource> source_;
  std::unique_ptr<engine::TorchEngineModel> engine_model_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<WeightSubscriber> subscriber_;
};

TEST_CASE(
    "device go-live: a version pulled by CUDA IPC goes live as views into the "
    "sink's copy, bit-exact, and the copies of swapped-out versions are "
    "released") {
  DeviceWorker worker;
  worker.Start();
  for (uint64_t v = 1; v <= 3; ++v) {
    const Bytes published = worker.Weights(10 + v);
    worker.Publish(v, published, /*device=*/true);
    worker.GoLive(v);
    CHECK(worker.Live() == published);
    CHECK(worker.LiveInsideLastCopy());
    // The live copy, and at most the one the engine swapped out just now
    // (the staged source drops it at its next commit).
    CHECK(worker.sink().held() <= 2);
  }
  CHECK(worker.sink().handed_over() == 3);
  CHECK(worker.subscriber().versions_received() == 3);
  CHECK(worker.Count("tandem_weight_sync_versions_total", "cuda_ipc") == 3);
  CHECK(worker.Count("tandem_weight_sync_rejected_versions_total",
                     "cuda_ipc") == 0);
}

TEST_CASE(
    "device go-live: after a version went live from the device the host "
    "staging has followed it, so the next DELTA applies") {
  DeviceWorker worker;
  worker.Start();
  const Bytes v1 = worker.Weights(21);
  worker.Publish(1, v1, /*device=*/true);
  worker.GoLive(1);
  REQUIRE(worker.LiveInsideLastCopy());
  // Version 2 only as a DELTA on version 1 (no FULL copy, nothing in the
  // ring): it applies to the host staging's bytes, which must be v1's.
  Bytes v2 = v1;
  for (size_t i = 0; i < v2.size(); i += 4096) v2[i] ^= 0x01;
  worker.Publish(2, v2, /*device=*/false, &v1);
  worker.GoLive(2);
  CHECK(worker.Live() == v2);
  CHECK(worker.Count("tandem_weight_sync_versions_total", "pull") == 1);
  // And the next version by CUDA IPC plans from v2.
  const Bytes v3 = worker.Weights(23);
  worker.Publish(3, v3, /*device=*/true);
  worker.GoLive(3);
  CHECK(worker.Live() == v3);
  CHECK(worker.LiveInsideLastCopy());
  CHECK(worker.Count("tandem_weight_sync_rejected_versions_total",
                     "cuda_ipc") == 0);
}

// Version 1 goes live, then `publish_bad` publishes a version 2 that must
// be refused: the live version stays, the refusal is counted under
// `metric` (transport cuda_ipc), and version 2 is not fetched again: the
// sink copies it once, then only version 3.
void CheckRefused(DeviceWorker& worker, const std::string& metric,
                  const std::function<void()>& publish_bad) {
  const Bytes v1 = worker.Weights(31);
  worker.Publish(1, v1, /*device=*/true);
  worker.GoLive(1);
  const int copies_before = worker.sink().copies;
  publish_bad();
  REQUIRE(WaitFor(
      [&] {
        return worker.Count("tandem_weight_sync_rejected_versions_total",
                            "cuda_ipc") == 1;
      },
      absl::Seconds(20)));
  CHECK(worker.Count(metric, "cuda_ipc") == 1);
  CHECK(worker.source().ReadyVersion(worker.engine().policy_version()) == 0);
  CHECK(worker.Live() == v1);
  const Bytes v3 = worker.Weights(33);
  worker.Publish(3, v3, /*device=*/true);
  worker.GoLive(3);
  CHECK(worker.Live() == v3);
  CHECK(worker.LiveInsideLastCopy());
  CHECK(worker.sink().copies == copies_before + 2);
  CHECK(worker.Count(metric, "cuda_ipc") == 1);
  CHECK(worker.Count("tandem_weight_sync_rejected_versions_total",
                     "cuda_ipc") == 1);
}

TEST_CASE(
    "device go-live: a copy with a flipped byte is refused by its CRC-32C, "
    "counted, live kept, not fetched again") {
  DeviceWorker worker;
  int takes = 0;
  worker.sink().before_hand_over = [&](absl::Span<uint8_t> copy) {
    if (++takes == 2) copy[copy.size() / 2] ^= 0x10;
  };
  worker.Start();
  CheckRefused(worker, "tandem_weight_sync_rejected_versions_total",
               [&] { worker.Publish(2, worker.Weights(32), /*device=*/true); });
}

TEST_CASE(
    "device go-live: a version holding a NaN is refused, counted as "
    "non-finite, live kept, not fetched again") {
  DeviceWorker worker;
  worker.Start();
  CheckRefused(worker, "tandem_weight_sync_nonfinite_versions_total", [&] {
    Bytes bad = worker.Weights(32);
    const weights::TensorPlacement& t = worker.layout().tensors()[0];
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bad.data() + t.offset + 4 * 3, &nan, sizeof(nan));
    worker.Publish(2, bad, /*device=*/true);
  });
}

TEST_CASE(
    "device go-live: a version whose bytes do not match the trusted SHA-256 "
    "is refused, counted as a digest mismatch, live kept, not fetched "
    "again") {
  DeviceWorker worker;
  worker.Start();
  CheckRefused(worker, "tandem_weight_sync_digest_mismatches_total", [&] {
    worker.Publish(
        2, worker.Weights(32), /*device=*/true, nullptr,
        [](v1::WeightManifest& m) { m.set_sha256(std::string(32, '\x5a')); });
  });
}

TEST_CASE(
    "host follow: a copy verified elsewhere is committed when it matches the "
    "manifest's CRC-32Cs, rejected when it does not, and a refusal recorded "
    "elsewhere is kept for the receivers") {
  auto layout = weights::FlatWeightLayout::Create(
      weights::testing::SmallModelTensors(),
      {.bucket_bytes = 4096, .alignment = 64});
  REQUIRE(layout.ok());
  auto staging = weights::StagingWeights::Create(
      *layout, weights::StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  std::mt19937_64 rng(7);
  weights::WeightBuffer v1(layout->total_bytes());
  weights::testing::FillRandom(*layout, &v1, rng);
  auto m1 = layout->BuildManifest(v1.span(), 1);
  REQUIRE(m1.ok());
  auto copy_of = [](const weights::WeightBuffer& from) {
    return [&from](absl::Span<uint8_t> dst) {
      std::memcpy(dst.data(), from.data(), dst.size());
      return absl::OkStatus();
    };
  };
  REQUIRE((*staging)->CommitVerifiedElsewhere(*m1, copy_of(v1)).ok());
  CHECK((*staging)->live_version() == 1u);
  CHECK(std::memcmp((*staging)->live().bytes.data(), v1.data(), v1.size()) ==
        0);
  // A copy that differs from what was verified: DataLoss, live stays.
  weights::WeightBuffer v2(layout->total_bytes());
  weights::testing::FillRandom(*layout, &v2, rng);
  auto m2 = layout->BuildManifest(v2.span(), 2);
  REQUIRE(m2.ok());
  weights::WeightBuffer bad(layout->total_bytes());
  std::memcpy(bad.data(), v2.data(), v2.size());
  bad.data()[layout->tensors()[0].offset] ^= 0x04;
  const absl::Status refused =
      (*staging)->CommitVerifiedElsewhere(*m2, copy_of(bad));
  CHECK(absl::IsDataLoss(refused));
  CHECK((*staging)->live_version() == 1u);
  CHECK((*staging)->stats().rejected_versions == 1);
  // How the device paths classify what GoLiveFromStagedTensor refused.
  using Refusal = weights::StagingWeights::Refusal;
  CHECK(weights::StagingWeights::RefusalOf(refused) == Refusal::kCorrupt);
  CHECK(weights::StagingWeights::RefusalOf(weights::CheckWeightSha256(
            2, std::string(32, 'a'), std::string(32, 'b'), 64)) ==
        Refusal::kDigestMismatch);
  CHECK(weights::StagingWeights::RefusalOf(weights::NonFiniteWeightsError(
            2, *layout, 0, {.index = 3, .nan = true})) ==
        Refusal::kNonFinite);
  // Not a FULL version: refused before anything is copied.
  v1::WeightManifest delta = *m2;
  delta.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
  delta.set_base_version(1);
  CHECK(absl::IsInvalidArgument(
      (*staging)->CommitVerifiedElsewhere(delta, copy_of(v2))));
  // A refusal on the device: counted by cause, kept as refused_version.
  (*staging)->RecordRefusedElsewhere(
      2, weights::StagingWeights::Refusal::kNonFinite);
  CHECK((*staging)->refused_version() == 2u);
  CHECK((*staging)->stats().nonfinite_versions == 1);
  CHECK((*staging)->stats().rejected_versions == 2);
  REQUIRE((*staging)->CommitVerifiedElsewhere(*m2, copy_of(v2)).ok());
  CHECK((*staging)->live_version() == 2u);
  CHECK((*staging)->stats().commits == 2);
}

}  // namespace
}  // namespace tandem::rollout
