// Gloo broadcast groups formed through the rendezvous store over the
// trainer's gRPC (issue 25 item 3): the trainer's rank uses its
// RendezvousKeys in-process, the other ranks a RendezvousClient with a
// rollout certificate against a real mTLS GrpcServer serving the
// trainer's RendezvousService. Versions arrive bit for bit; the
// BroadcastSender with rendezvous keys advertises the gRPC store, forms
// one group per epoch and drops the epoch it leaves; a member with a
// verifier certificate cannot rendezvous. Ranks are threads of this
// process on loopback.

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/broadcast_sender.h"
#include "common/weights/broadcast/rendezvous_keys.h"
#if TANDEM_ENABLE_NCCL
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#endif
#include "rendezvous_test_util.h"
#include "weights_test_util.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

using tandem::testing::IssuedCertificates;
using tandem::testing::RoleTls;
using tandem::testing::TempDir;

// The trainer's store; a member's keyspace is a client of it.
struct GrpcStore : tandem::testing::RendezvousTestServer {
  using RendezvousTestServer::RendezvousTestServer;
  std::shared_ptr<RendezvousKeyspace> Member(const rpc::TlsOptions& tls) {
    return Client(tls);
  }
};

BroadcastGroupConfig Config(std::shared_ptr<RendezvousKeyspace> keyspace,
                            int rank, int world, const std::string& prefix,
                            absl::Duration timeout = absl::Seconds(20)) {
  BroadcastGroupConfig c =
      testing::GroupConfig(0, rank, world, prefix, timeout);
  c.rendezvous = std::move(keyspace);
  return c;
}

// A worker rank: joins and receives `count` versions; the last one's bytes.
struct Received {
  absl::Status status;
  std::vector<uint8_t> last;
};

void Receive(const FlatWeightLayout& layout, const BroadcastGroupConfig& config,
             int count, Received* out) {
  absl::StatusOr<std::unique_ptr<BroadcastGroup>> group =
      CreateBroadcastGroup(config);
  if (!group.ok()) {
    out->status = group.status();
    return;
  }
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  BroadcastWeightReceiver receiver(group->get());
  for (int i = 0; i < count; ++i) {
    auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
    if (!got.ok()) {
      out->status = got.status();
      return;
    }
    if (auto committed = (*staging)->Commit(); !committed.ok()) {
      out->status = committed.status();
      return;
    }
  }
  auto live = (*staging)->live();
  out->last.assign(live.bytes.begin(), live.bytes.end());
}

TEST_CASE(
    "a gloo group forms through the gRPC store with mTLS; weights arrive "
    "equal",
    "[weights][gloo]") {
  auto certs = IssuedCertificates();
  GrpcStore store(*certs);
  const FlatWeightLayout layout = testing::SmallLayout();
  constexpr int kWorld = 3;
  std::mt19937_64 rng(11);
  std::vector<WeightBuffer> versions;
  for (int v = 0; v < 2; ++v) {
    versions.emplace_back(layout.total_bytes());
    testing::FillRandom(layout, &versions.back(), rng);
  }
  const std::string prefix = "tandem/weights/epoch1";
  std::vector<Received> received(kWorld);
  std::vector<std::thread> workers;
  for (int rank = 1; rank < kWorld; ++rank) {
    workers.emplace_back([&, rank] {
      Receive(layout,
              Config(store.Member(RoleTls(*certs, "rollout")), rank, kWorld,
                     prefix),
              2, &received[rank]);
    });
  }
  store.keys->EnterScope(prefix);
  absl::StatusOr<std::unique_ptr<BroadcastGroup>> group =
      CreateBroadcastGroup(Config(store.keys, 0, kWorld, prefix));
  REQUIRE(group.ok());
  BroadcastWeightSender sender(group->get());
  for (uint64_t v = 0; v < versions.size(); ++v) {
    auto m = layout.BuildManifest(versions[v].span(), v);
    REQUIRE(
        sender.Publish(*m, versions[v].span(), absl::InfiniteFuture()).ok());
  }
  for (auto& t : workers) t.join();
  for (int rank = 1; rank < kWorld; ++rank) {
    INFO("rank " << rank << ": " << received[rank].status.ToString());
    REQUIRE(received[rank].status.ok());
    CHECK(received[rank].last ==
          std::vector<uint8_t>(versions[1].data(),
                               versions[1].data() + layout.total_bytes()));
  }
  // Gloo's keys of this epoch live under its scope on the trainer.
  CHECK(store.keys->NumKeys(prefix).value() > 0);
  CHECK(store.Refused("wrong_role") == 0);
}

TEST_CASE("a member with a verifier certificate cannot rendezvous",
          "[weights][gloo]") {
  auto certs = IssuedCertificates();
  GrpcStore store(*certs);
  absl::StatusOr<std::unique_ptr<BroadcastGroup>> group =
      CreateBroadcastGroup(Config(store.Member(RoleTls(*certs, "verifier")), 1,
                                  2, "g/epoch1", absl::Seconds(5)));
  REQUIRE_FALSE(group.ok());
  CHECK_THAT(std::string(group.status().message()),
             Catch::Contains("PERMISSION_DENIED"));
  CHECK(store.keys->NumKeys("g/epoch1").value() == 0);
}

TEST_CASE(
    "BroadcastSender with rendezvous keys: no TCPStore, one scope per "
    "epoch, the left epoch's keys dropped",
    "[weights][gloo]") {
  auto certs = IssuedCertificates();
  GrpcStore store(*certs);
  const FlatWeightLayout layout = testing::SmallLayout();
  BroadcastSenderOptions options;
  options.timeout = absl::Seconds(20);
  options.rendezvous_keys = store.keys;
  absl::Mutex mu;
  std::vector<BroadcastOutcome> outcomes;
  auto sender =
      BroadcastSender::Create(options, [&](const BroadcastOutcome& o) {
        absl::MutexLock lock(&mu);
        outcomes.push_back(o);
      });
  REQUIRE(sender.ok());
  CHECK((*sender)->store_address() == kGrpcRendezvousAddress);
  (*sender)->Start();
  std::mt19937_64 rng(3);
  auto group = [&](int epoch) {
    v1::BroadcastGroup g;
    g.set_epoch(epoch);
    g.set_store_address((*sender)->store_address());
    g.set_key_prefix("test/epoch" + std::to_string(epoch));
    g.add_member_ids("trainer");
    g.add_member_ids("w0");
    return g;
  };
  for (int epoch = 1; epoch <= 2; ++epoch) {
    INFO("epoch " << epoch);
    WeightBuffer buf(layout.total_bytes());
    testing::FillRandom(layout, &buf, rng);
    v1::WeightManifest manifest = *layout.BuildManifest(buf.span(), epoch);
    auto payload = std::make_shared<const std::vector<uint8_t>>(
        buf.data(), buf.data() + layout.total_bytes());
    Received r;
    std::thread worker([&] {
      Receive(layout,
              Config(store.Member(RoleTls(*certs, "rollout")), 1, 2,
                     group(epoch).key_prefix()),
              1, &r);
    });
    (*sender)->Enqueue(group(epoch), manifest, payload);
    worker.join();
    REQUIRE(r.status.ok());
    CHECK(r.last == *payload);
  }
  // Forming epoch 2 retired epoch 1: its keys are gone and a late member
  // of it is refused.
  CHECK(store.keys->live_scopes() == 1);
  auto late = store.Member(RoleTls(*certs, "rollout"));
  CHECK(late->Set("test/epoch1", "k", "v").code() ==
        absl::StatusCode::kFailedPrecondition);
  (*sender)->Stop();
  absl::MutexLock lock(&mu);
  REQUIRE(outcomes.size() == 2);
  for (const BroadcastOutcome& o : outcomes) CHECK(o.status.ok());
}

#if TANDEM_ENABLE_NCCL
// The NCCL transport reaches the store the same way (its unique id, or
// rank 0's refusal, is the one key it keeps there); no GPU needed.
TEST_CASE("an NCCL refusal goes through the gRPC store", "[weights][nccl]") {
  auto certs = IssuedCertificates();
  GrpcStore store(*certs);
  NcclGroupConfig c;
  c.rank = 1;
  c.world_size = 2;
  c.key_prefix = "refuse/epoch1";
  c.timeout = absl::Seconds(5);
  c.rendezvous = store.Member(RoleTls(*certs, "rollout"));
  REQUIRE(NcclRefuseGroup(c, "because").ok());
  absl::StatusOr<std::string> stored =
      store.keys->Get("refuse/epoch1", "refuse/epoch1/nccl_unique_id");
  REQUIRE(stored.ok());
  absl::Status s = NcclCheckStoredUniqueId(
      {reinterpret_cast<const uint8_t*>(stored->data()), stored->size()});
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "rank 0 cannot run NCCL: because");
  // A verifier cannot store one.
  c.rendezvous = store.Member(RoleTls(*certs, "verifier"));
  s = NcclRefuseGroup(c, "evil");
  CHECK(absl::IsUnavailable(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("PERMISSION_DENIED"));
}
#endif

}  // namespace
}  // namespace tandem::weights
