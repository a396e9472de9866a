// A broadcast-mode WeightSubscriber under tls.mode mtls (a data-plane key),
// in a real Gloo group whose rank 0 is the trainer (a thread here, sealing
// with PublishOverBroadcast as the trainer's sender does) and with the
// trainer's real WeightServer on loopback (the coordinator's SyncWeightGroup
// is a function naming both). A version it cannot open — sealed under an
// epoch older than its previous one, or with a ciphertext byte altered on
// the wire — is joined, refused after the collective and counted
// (tandem_weight_sync_decrypt_failures_total{transport="broadcast"},
// ..._rejected_versions_total), and the same version is pulled from the
// trainer (RejectBroadcast -> PullOnce): the worker ends bit-exact with the
// trainer's weights. A version sealed under the previous epoch, within its
// grace, is taken from the broadcast itself, with nothing counted and
// nothing pulled: the refusals above are the seal's doing.

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/broadcast/broadcast_protocol.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "prometheus/registry.h"
#include "services/rollout/weight_subscriber.h"
#include "tests/support/wait_for.h"
#include "tests/unit/model_test_util.h"
#include "tests/unit/weight_server_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>
// After Catch, which it uses.
#include "tests/support/raw_data_port.h"

namespace tandem::rollout {
namespace {

using ::tandem::testing::WaitFor;
using weights::testing::HolderOf;
using weights::testing::TestKey;

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

struct Outcome {
  absl::Status trainer;           // the trainer's publish
  uint64_t received_version = 0;  // the worker's, at the end
  bool bit_exact = false;         // its weights equal the trainer's
  double decrypt_failures = 0;    // {transport="broadcast"}
  double rejected = 0;            // {transport="broadcast"}
  double by_broadcast = 0;        // versions received, by transport
  double by_pull = 0;
};

// The trainer publishes version 1 (random weights) to its weight server
// (raw port keyed with `trainer_keys`) and broadcasts it, sealed with
// `trainer_keys` (one ciphertext byte of the first piece flipped when
// `tamper`), to a group of two: itself and one worker holding
// `worker_keys`.
Outcome RunCluster(std::shared_ptr<weights::DataPlaneKeyHolder> trainer_keys,
                   std::shared_ptr<weights::DataPlaneKeyHolder> worker_keys,
                   bool tamper, const std::string& prefix) {
  const model::ModelConfig config = model::testing::TinyQwen2Config();
  auto initial = model::RandomInit(config, 1);
  REQUIRE(initial.ok());
  auto decoder = std::make_shared<model::DecoderModel>(*initial);
  StagedWeightSource source(decoder);

  auto published = model::RandomInit(config, 11);
  REQUIRE(published.ok());
  auto layout = weights::LayoutForModel(**published);
  REQUIRE(layout.ok());
  auto flat = weights::FlattenModel(**published, *layout);
  REQUIRE(flat.ok());
  auto manifest = layout->BuildManifest(**flat, 1);
  REQUIRE(manifest.ok());
  manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  manifest->set_anchor_version(1);
  weights::WeightStore store(4);
  REQUIRE(store.Put(*manifest, *flat).ok());
  weights::testing::WeightServerLoopback server(
      &store, {.data_plane_key = trainer_keys});

  auto rendezvous =
      weights::GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(20));
  REQUIRE(rendezvous.ok());
  v1::BroadcastGroup group;
  group.set_epoch(1);
  group.set_store_address(absl::StrCat("127.0.0.1:", (*rendezvous)->port()));
  group.set_key_prefix(prefix);
  group.add_member_ids("trainer-1");
  group.add_member_ids("worker-1");
  group.set_backend("gloo");
  group.set_first_policy_version(1);

  Outcome out;
  std::thread trainer([&] {
    weights::BroadcastGroupConfig c;
    c.backend = "gloo";
    c.store_port = (*rendezvous)->port();
    c.key_prefix = prefix;
    c.rank = 0;
    c.world_size = 2;
    c.timeout = absl::Seconds(20);
    auto g = weights::GlooBroadcastGroup::Create(c, rendezvous->get());
    if (!g.ok()) {
      out.trainer = g.status();
      return;
    }
    int count = 0;  // header, manifest, then the first piece
    out.trainer = weights::PublishOverBroadcast(
        [&](absl::Span<uint8_t> bytes) {
          if (tamper && count == 2) bytes[bytes.size() / 2] ^= 0x01;
          ++count;
          return (*g)->Broadcast(bytes);
        },
        *manifest, absl::MakeConstSpan(**flat), 0, trainer_keys.get());
  });

  prometheus::Registry registry;
  weights::WeightSyncMetrics metrics(registry);
  WeightSyncOptions options;
  options.mode = WeightSyncOptions::Mode::kBroadcast;
  options.member_id = [] { return std::string("worker-1"); };
  options.sync_weight_group = [&](const v1::SyncWeightGroupRequest&,
                                  v1::SyncWeightGroupResponse* response) {
    response->set_policy_version(1);
    response->set_weight_server_address(server.address());
    *response->mutable_group() = group;
    return grpc::Status::OK;
  };
  options.timeout = absl::Seconds(20);
  options.pull_shared_memory = false;
  options.data_plane_key = worker_keys;
  options.metrics = &metrics;
  auto subscriber = WeightSubscriber::Create(decoder, &source, 0, options);
  REQUIRE(subscriber.ok());
  (*subscriber)->Start();
  trainer.join();
  WaitFor([&] { return (*subscriber)->received_version() == 1; },
          absl::Seconds(20));
  (*subscriber)->Stop();

  out.received_version = (*subscriber)->received_version();
  if (source.ReadyVersion(0) == 1 && source.Commit(1).ok()) {
    auto live = weights::FlattenModel(*decoder->weights(), *layout);
    REQUIRE(live.ok());
    out.bit_exact = (*live)->size() == (*flat)->size() &&
                    std::memcmp((*live)->data(), (*flat)->data(),
                                (*flat)->size()) == 0;
  }
  out.decrypt_failures =
      Counter(registry, "tandem_weight_sync_decrypt_failures_total",
              {{"transport", "broadcast"}});
  out.rejected = Counter(registry, "tandem_weight_sync_rejected_versions_total",
                         {{"transport", "broadcast"}});
  out.by_broadcast =
      Counter(registry, "tandem_weight_sync_versions_total",
              {{"direction", "received"}, {"transport", "broadcast"}});
  out.by_pull = Counter(registry, "tandem_weight_sync_versions_total",
                        {{"direction", "received"}, {"transport", "pull"}});
  return out;
}

// The worker has moved from epoch 4 to 5 (4 still in its grace).
std::shared_ptr<weights::DataPlaneKeyHolder> RotatedWorker(
    const weights::DataPlaneKey& k4, const weights::DataPlaneKey& k5) {
  auto worker = std::make_shared<weights::DataPlaneKeyHolder>();
  worker->Set(k4, absl::Hours(1));
  worker->Set(k5, absl::Hours(1));
  return worker;
}

// The worker ends bit-exact at version 1: pulled after one refused
// broadcast (`refused`), or from the broadcast with nothing refused.
void CheckReceived(const Outcome& out, bool refused) {
  INFO("trainer: " << out.trainer.ToString());
  REQUIRE(out.trainer.ok());
  CHECK(out.received_version == 1);
  CHECK(out.bit_exact);
  CHECK(out.decrypt_failures == (refused ? 1 : 0));
  CHECK(out.rejected == (refused ? 1 : 0));
  CHECK(out.by_broadcast == (refused ? 0 : 1));
  CHECK(out.by_pull == (refused ? 1 : 0));
}

TEST_CASE(
    "a broadcast sealed under an older epoch is refused, counted, and the "
    "same version pulled bit-exact") {
  const weights::DataPlaneKey k4 = TestKey(4), k5 = TestKey(5);
  // A trainer still at epoch 3, two rotations behind the worker: its raw
  // port refuses the worker's epoch-5 proof too, so the pull comes over
  // FetchWeights.
  CheckReceived(RunCluster(HolderOf(TestKey(3)), RotatedWorker(k4, k5),
                           /*tamper=*/false, "seal-older"),
                /*refused=*/true);
}

TEST_CASE(
    "a broadcast with a ciphertext byte altered on the wire is refused, "
    "counted, and the same version pulled bit-exact") {
  const weights::DataPlaneKey k4 = TestKey(4), k5 = TestKey(5);
  CheckReceived(RunCluster(HolderOf(k5), RotatedWorker(k4, k5),
                           /*tamper=*/true, "seal-tampered"),
                /*refused=*/true);
}

TEST_CASE(
    "a broadcast sealed under the previous epoch within its grace is "
    "received by broadcast, nothing refused or pulled") {
  const weights::DataPlaneKey k4 = TestKey(4), k5 = TestKey(5);
  CheckReceived(RunCluster(HolderOf(k4), RotatedWorker(k4, k5),
                           /*tamper=*/false, "seal-grace"),
                /*refused=*/false);
}

}  // namespace
}  // namespace tandem::rollout
