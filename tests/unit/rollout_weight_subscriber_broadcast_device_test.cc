// The rollout worker's device broadcast receive, on the CPU: a
// broadcast-mode WeightSubscriber in an epoch whose group broadcasts
// "device" memory receives each version with ReceiveDeviceOverBroadcast
// into a buffer of its pool, verifies it with GoLiveFromStagedTensor and
// stages the live weights as views into that buffer; the host staging
// follows. The trainer is real where it matters: its broadcast is
// PublishDeviceOverBroadcast (FULL) or PublishOverBroadcast (DELTA), its
// WeightServer serves pulls and the trusted digest (GetManifest) on
// loopback. The group's wire is an in-process queue and host memory stands
// in for device memory (weights_device_test_util.h: seams of the device
// and the NCCL transport, not mocks of a daemon), so this is the code a GPU
// worker runs but for the CUDA calls (tests/gpu/ runs those).

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/broadcast/broadcast_protocol.h"
#include "common/weights/model_flattening.h"
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
#include "tests/unit/model_test_util.h"
#include "tests/unit/weight_server_test_util.h"
#include "tests/unit/weights_device_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

using ::tandem::testing::WaitFor;
using weights::testing::Bytes;

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

// The group's wire: what rank 0 broadcast, in order, until rank 1 takes it.
struct Wire {
  absl::Mutex mu;
  std::deque<Bytes> queue ABSL_GUARDED_BY(mu);
  bool aborted ABSL_GUARDED_BY(mu) = false;
  // Flips a byte of the next bucket rank 1 receives.
  std::atomic<bool> flip_next_bucket{false};
  void Push(const uint8_t* p, uint64_t n) {
    absl::MutexLock lock(&mu);
    queue.emplace_back(p, p + n);
  }
};

// Rank 0 (the trainer) of a group of two that broadcasts device memory.
class TrainerEnd : public weights::BroadcastGroup {
 public:
  explicit TrainerEnd(Wire* wire) : wire_(wire) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  bool broken() const override { return false; }
  bool broadcasts_device_memory() const override { return true; }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    wire_->Push(bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  absl::Status BroadcastDevice(void* ptr, uint64_t bytes) override {
    wire_->Push(static_cast<const uint8_t*>(ptr), bytes);
    return absl::OkStatus();
  }
  void Abort() override {}

 private:
  Wire* wire_;
};

// Rank 1 (the worker): takes each broadcast off the wire, waiting for it
// as a collective does, until Abort or its deadline.
class WorkerEnd : public weights::BroadcastGroup {
 public:
  explicit WorkerEnd(Wire* wire) : wire_(wire) {}
  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  bool broken() const override {
    absl::MutexLock lock(&wire_->mu);
    return wire_->aborted;
  }
  bool broadcasts_device_memory() const override { return true; }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    return Take(bytes, false);
  }
  absl::Status BroadcastDevice(void* ptr, uint64_t bytes) override {
    return Take({static_cast<uint8_t*>(ptr), bytes}, true);
  }
  void Abort() override {
    absl::MutexLock lock(&wire_->mu);
    wire_->aborted = true;
  }

 private:
  absl::Status Take(absl::Span<uint8_t> into, bool bucket) {
    absl::MutexLock lock(&wire_->mu);
    wire_->mu.AwaitWithTimeout(
        absl::Condition(
            +[](Wire* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
              return w->aborted || !w->queue.empty();
            },
            wire_),
        absl::Seconds(10));
    if (wire_->aborted) return absl::CancelledError("aborted");
    if (wire_->queue.empty()) return absl::DeadlineExceededError("no data");
    Bytes next = std::move(wire_->queue.front());
    wire_->queue.pop_front();
    if (next.size() != into.size()) {
      wire_->aborted = true;
      return absl::DataLossError("wire: size mismatch");
    }
    std::memcpy(into.data(), next.data(), next.size());
    if (bucket && wire_->flip_next_bucket.exchange(false)) {
      into[into.size() / 2] ^= 0x10;
    }
    return absl::OkStatus();
  }

  Wire* wire_;
};

// Host memory standing in for device memory, remembering its buffers.
class PoolMemory : public weights::testing::HostMemory {
 public:
  absl::StatusOr<uint8_t*> Allocate(uint64_t n) override {
    absl::StatusOr<uint8_t*> p = HostMemory::Allocate(n);
    if (p.ok()) buffers.push_back(*p);
    return p;
  }
  std::vector<uint8_t*> buffers;
};

// A worker (decoder on the CPU, engine, broadcast-mode subscriber whose
// group is the wire's rank 1 and whose "device" is PoolMemory) and a
// trainer (rank 0 of the wire, WeightServer on loopback).
class BroadcastWorker {
 public:
  BroadcastWorker()
      : config_(model::testing::TinyQwen2Config()),
        server_(&store_, {}),
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
    group_.set_epoch(1);
    group_.set_store_address("127.0.0.1:1");
    group_.set_key_prefix("bcast-device");
    group_.add_member_ids("trainer-1");
    group_.add_member_ids("worker-1");
    group_.set_backend("nccl");
    group_.set_first_policy_version(1);
    WeightSyncOptions options;
    options.mode = WeightSyncOptions::Mode::kBroadcast;
    options.member_id = [] { return std::string("worker-1"); };
    const std::string address = server_.address();
    options.sync_weight_group = [this, address](
                                    const v1::SyncWeightGroupRequest&,
                                    v1::SyncWeightGroupResponse* r) {
      r->set_policy_version(latest_.load());
      r->set_weight_server_address(address);
      *r->mutable_group() = group_;
      return grpc::Status::OK;
    };
    options.timeout = absl::Seconds(10);
    options.pull_shared_memory = false;
    options.metrics = &metrics_;
    options.create_group_for_test = [this](const weights::BroadcastGroupConfig&)
        -> absl::StatusOr<std::unique_ptr<weights::BroadcastGroup>> {
      return std::make_unique<WorkerEnd>(&wire_);
    };
    options.device_memory_for_test = &memory_;
    auto subscriber =
        WeightSubscriber::Create(decoder_, source_.get(), 0, options);
    REQUIRE(subscriber.ok());
    subscriber_ = *std::move(subscriber);
  }
  ~BroadcastWorker() { subscriber_->Stop(); }

  void Start() { subscriber_->Start(); }

  Bytes Weights(uint64_t seed) {
    auto w = model::RandomInit(config_, seed);
    REQUIRE(w.ok());
    auto flat = weights::FlattenModel(**w, *layout_);
    REQUIRE(flat.ok());
    return Bytes((*flat)->begin(), (*flat)->end());
  }

  // Publishes `bytes` as version `v`: a FULL version (or, with `delta_on`,
  // a DELTA on that version's bytes) in the trainer's store, which serves
  // pulls and the trusted digest, and broadcast unless `broadcast` is
  // false. `trusted` edits the stored manifest, `in_band` the broadcast
  // one.
  void Publish(uint64_t v, const Bytes& bytes, const Bytes* delta_on = nullptr,
               bool broadcast = true,
               const std::function<void(v1::WeightManifest&)>& trusted = {},
               const std::function<void(v1::WeightManifest&)>& in_band = {}) {
    auto manifest = layout_->BuildManifest(bytes, v);
    REQUIRE(manifest.ok());
    manifest->set_anchor_version(delta_on == nullptr ? v : v - 1);
    v1::WeightManifest sent = *manifest;
    std::shared_ptr<const Bytes> payload;
    if (delta_on != nullptr) {
      auto delta = kernels::EncodeBf16Delta(kernels::AsWords(*delta_on),
                                            kernels::AsWords(bytes));
      REQUIRE(delta.ok());
      sent.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
      sent.set_base_version(v - 1);
      payload = std::make_shared<const Bytes>(*std::move(delta));
    } else {
      sent.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
      payload = std::make_shared<const Bytes>(bytes);
    }
    v1::WeightManifest stored = sent;
    if (trusted) trusted(stored);
    if (in_band) in_band(sent);
    REQUIRE(store_.Put(stored, payload).ok());
    if (broadcast) {
      TrainerEnd trainer(&wire_);
      if (delta_on == nullptr) {
        REQUIRE(weights::PublishDeviceOverBroadcast(
                    &trainer, sent, payload->data(), payload->size())
                    .ok());
      } else {
        REQUIRE(weights::PublishOverBroadcast(
                    [&](absl::Span<uint8_t> b) { return trainer.Broadcast(b); },
                    sent, *payload)
                    .ok());
      }
    }
    latest_ = v;
  }

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

  Bytes Live() {
    auto flat = weights::FlattenModel(*decoder_->weights(), *layout_);
    REQUIRE(flat.ok());
    return Bytes((*flat)->begin(), (*flat)->end());
  }

  // Whether every live tensor lies inside one buffer of the pool.
  bool LiveInPool() {
    for (const uint8_t* base : memory_.buffers) {
      bool inside = true;
      for (const auto& [name, tensor] : decoder_->weights()->tensors()) {
        const auto* p = static_cast<const uint8_t*>(tensor.data_ptr());
        if (p < base || p + tensor.nbytes() > base + layout_->total_bytes()) {
          inside = false;
          break;
        }
      }
      if (inside) return true;
    }
    return false;
  }

  double Count(const std::string& name, const std::string& transport) {
    return Counter(registry_, name,
                   {{"transport", transport}, {"direction", "received"}});
  }
  double Refused(const std::string& name, const std::string& transport) {
    return Counter(registry_, name, {{"transport", transport}});
  }

  const weights::FlatWeightLayout& layout() const { return *layout_; }
  Wire& wire() { return wire_; }
  PoolMemory& memory() { return memory_; }
  WeightSubscriber& subscriber() { return *subscriber_; }

 private:
  const model::ModelConfig config_;
  weights::WeightStore store_{8};
  weights::testing::WeightServerLoopback server_;
  prometheus::Registry registry_;
  weights::WeightSyncMetrics metrics_;
  Wire wire_;
  PoolMemory memory_;  // outlives the subscriber's pool
  v1::BroadcastGroup group_;
  std::atomic<uint64_t> latest_{0};
  std::unique_ptr<weights::FlatWeightLayout> layout_;
  std::shared_ptr<model::DecoderModel> decoder_;
  std::unique_ptr<StagedWeightSource> source_;
  std::unique_ptr<engine::TorchEngineModel> engine_model_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<WeightSubscriber> subscriber_;
};

Bytes Nudged(const Bytes& from) {
  Bytes to = from;
  for (size_t i = 0; i < to.size(); i += 4096) to[i] ^= 0x01;
  return to;
}

TEST_CASE(
    "device broadcast: FULL then DELTA go live as views of pool buffers, "
    "bit-exact, and the host staging follows (a refused broadcast's pull "
    "patches a DELTA onto it)") {
  BroadcastWorker worker;
  worker.Start();
  const Bytes v1 = worker.Weights(11);
  worker.Publish(1, v1);
  worker.GoLive(1);
  CHECK(worker.Live() == v1);
  CHECK(worker.LiveInPool());
  // A DELTA patched on a device copy of v1's buffer.
  const Bytes v2 = Nudged(v1);
  worker.Publish(2, v2, &v1);
  worker.GoLive(2);
  CHECK(worker.Live() == v2);
  CHECK(worker.LiveInPool());
  CHECK(worker.Count("tandem_weight_sync_versions_total", "broadcast") == 2);
  // v3 arrives with a bucket byte flipped on the wire: refused by its
  // CRC-32C and pulled; the trainer only has v3 as a DELTA on v2, which
  // the pull applies to the host staging's bytes: those of v2 only if the
  // staging followed the device go-live.
  const Bytes v3 = Nudged(v2);
  worker.Publish(3, v3, &v2, /*broadcast=*/false);
  worker.wire().flip_next_bucket = true;
  {
    // The broadcast is FULL (the device sender's kind), the store's a DELTA.
    TrainerEnd trainer(&worker.wire());
    auto m = worker.layout().BuildManifest(v3, 3);
    REQUIRE(m.ok());
    m->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
    REQUIRE(
        weights::PublishDeviceOverBroadcast(&trainer, *m, v3.data(), v3.size())
            .ok());
  }
  worker.GoLive(3);
  CHECK(worker.Live() == v3);
  CHECK(worker.Refused("tandem_weight_sync_rejected_versions_total",
                       "broadcast") == 1);
  CHECK(worker.Count("tandem_weight_sync_versions_total", "pull") == 1);
  // v4 as a DELTA on v3, which the host path delivered: the base comes
  // from the host staging (no device buffer holds v3).
  const Bytes v4 = Nudged(v3);
  worker.Publish(4, v4, &v3);
  worker.GoLive(4);
  CHECK(worker.Live() == v4);
  CHECK(worker.LiveInPool());
  CHECK(worker.Count("tandem_weight_sync_versions_total", "broadcast") == 3);
  // Live, staged-in-waiting and receiving: never more buffers.
  CHECK(worker.memory().buffers.size() <= 3);
}

TEST_CASE(
    "device broadcast: a version holding a NaN is refused, counted as "
    "non-finite under broadcast, live kept, not fetched again") {
  BroadcastWorker worker;
  worker.Start();
  const Bytes v1 = worker.Weights(21);
  worker.Publish(1, v1);
  worker.GoLive(1);
  Bytes bad = worker.Weights(22);
  const weights::TensorPlacement& t = worker.layout().tensors()[0];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + t.offset + 4 * 3, &nan, sizeof(nan));
  worker.Publish(2, bad);
  REQUIRE(WaitFor(
      [&] {
        return worker.Refused("tandem_weight_sync_nonfinite_versions_total",
                              "broadcast") == 1;
      },
      absl::Seconds(20)));
  CHECK(worker.Live() == v1);
  // The refusal's pull waits 2 s for a version newer than v2 (the refused
  // one is not fetched); v3 is published after it gave up, so v3 comes by
  // broadcast (a pull of it would be right too, but not what is tested).
  absl::SleepFor(absl::Seconds(3));
  const Bytes v3 = worker.Weights(23);
  worker.Publish(3, v3);
  worker.GoLive(3);
  CHECK(worker.Live() == v3);
  CHECK(worker.LiveInPool());
  CHECK(worker.Refused("tandem_weight_sync_rejected_versions_total",
                       "broadcast") == 1);
  CHECK(worker.Count("tandem_weight_sync_versions_total", "pull") == 0);
}

TEST_CASE(
    "device broadcast: the digest is the trusted one (GetManifest): a wrong "
    "trusted digest is refused and counted, live kept; a wrong in-band one "
    "is not looked at") {
  BroadcastWorker worker;
  worker.Start();
  const Bytes v1 = worker.Weights(31);
  worker.Publish(1, v1);
  worker.GoLive(1);
  auto wrong = [](v1::WeightManifest& m) {
    m.set_sha256(std::string(32, 'Z'));
  };
  worker.Publish(2, worker.Weights(32), nullptr, true, wrong);
  REQUIRE(WaitFor(
      [&] {
        return worker.Refused("tandem_weight_sync_digest_mismatches_total",
                              "broadcast") == 1;
      },
      absl::Seconds(20)));
  CHECK(worker.Live() == v1);
  // The pull of v2 meets the same trusted digest and refuses it too.
  REQUIRE(WaitFor(
      [&] {
        return worker.Refused("tandem_weight_sync_digest_mismatches_total",
                              "pull") == 1;
      },
      absl::Seconds(20)));
  const Bytes v3 = worker.Weights(33);
  worker.Publish(3, v3, nullptr, true, {}, wrong);
  worker.GoLive(3);
  CHECK(worker.Live() == v3);
  CHECK(worker.LiveInPool());
  CHECK(worker.Refused("tandem_weight_sync_digest_mismatches_total",
                       "broadcast") == 1);
}

}  // namespace
}  // namespace tandem::rollout
