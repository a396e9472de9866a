// A broadcast-mode WeightSubscriber outside the broadcast group, with a
// ClusterWatcher streaming from a real coordinator over loopback gRPC and a
// real WeightServer: while the stream is open its pull waits a whole
// watch_poll_interval (60 s here) for a newer version, yet an epoch that
// lists it wakes it at once (the epoch event interrupts the pull's wait),
// and a new version still arrives at once (the pull waits for exactly that).

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_watcher.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"
#include "common/weights/weight_server.h"
#include "common/weights/weight_store.h"
#include "services/coordinator/coordinator.h"
#include "services/rollout/weight_subscriber.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

// A TCP port on loopback that accepts connections (the kernel's backlog)
// and never answers: a rendezvous store there keeps a joining member in
// its rendezvous until its timeout.
class SilentPort {
 public:
  SilentPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(listen(fd_, 16) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

v1::WeightManifest Manifest(const model::ModelWeights& w, uint64_t version,
                            std::shared_ptr<const std::vector<uint8_t>>* flat) {
  auto layout = weights::LayoutForModel(w);
  REQUIRE(layout.ok());
  auto bytes = weights::FlattenModel(w, *layout);
  REQUIRE(bytes.ok());
  auto manifest = layout->BuildManifest(**bytes, version);
  REQUIRE(manifest.ok());
  manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  manifest->set_anchor_version(version);
  *flat = *bytes;
  return *manifest;
}

template <typename Predicate>
bool WaitFor(Predicate done, absl::Duration limit) {
  const absl::Time give_up = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST_CASE(
    "a worker outside the group waits long, yet joins a new epoch listing "
    "it at once") {
  // The coordinator, with a trainer whose rendezvous store never answers.
  coordinator::CoordinatorConfig config;
  config.server.grpc_address = "127.0.0.1:0";
  config.server.metrics_address = "";
  config.training.groups_per_version = 100000;
  config.heartbeat_timeout_ms = 600000;  // no heartbeats in this test
  auto created = coordinator::Coordinator::Create(config);
  REQUIRE(created.ok());
  std::unique_ptr<coordinator::Coordinator> coordinator = *std::move(created);
  REQUIRE(coordinator->Start().ok());
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      coordinator->grpc_address(), grpc::InsecureChannelCredentials()));
  SilentPort store_port;
  auto register_member = [&](v1::Role role) {
    v1::RegisterRequest request;
    request.set_role(role);
    request.set_grpc_address("127.0.0.1:1");
    if (role == v1::ROLE_TRAINER) {
      (*request.mutable_capabilities())["weight_broadcast_store"] =
          absl::StrCat("127.0.0.1:", store_port.port());
    }
    v1::RegisterResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->Register(&context, request, &response).ok());
    return response.member_id();
  };
  const std::string trainer_id = register_member(v1::ROLE_TRAINER);
  const std::string worker_id = register_member(v1::ROLE_ROLLOUT);

  // The trainer's weight server.
  weights::WeightStore store(4);
  weights::WeightServerService service(&store, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  const std::string weight_server = absl::StrCat("127.0.0.1:", port);
  const model::ModelConfig model_config = model::testing::TinyQwen2Config();
  std::map<uint64_t, v1::WeightManifest> manifests;
  // The trainer stores `version` on its weight server ...
  auto put = [&](uint64_t version) {
    auto w = model::RandomInit(model_config, 10 + version);
    REQUIRE(w.ok());
    std::shared_ptr<const std::vector<uint8_t>> flat;
    manifests[version] = Manifest(**w, version, &flat);
    REQUIRE(store.Put(manifests[version], flat).ok());
  };
  // ... and announces it to the coordinator, which answers with the group
  // that receives it.
  auto announce = [&](uint64_t version) {
    v1::PublishPolicyVersionRequest request;
    request.set_member_id(trainer_id);
    *request.mutable_manifest() = manifests.at(version);
    request.set_weight_server_address(weight_server);
    v1::PublishPolicyVersionResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->PublishPolicyVersion(&context, request, &response).ok());
    return response.group();
  };
  put(1);
  // Epoch 1: the trainer alone (the worker has not reported yet).
  REQUIRE(announce(1).member_ids_size() == 1);

  auto initial = model::RandomInit(model_config, 1);
  REQUIRE(initial.ok());
  auto decoder = std::make_shared<model::DecoderModel>(*initial);
  StagedWeightSource source(decoder);
  cluster::ClusterWatcher watcher(stub.get(),
                                  {.member_id = [&] { return worker_id; }});
  watcher.Start();
  WeightSyncOptions options;
  options.mode = WeightSyncOptions::Mode::kBroadcast;
  options.coordinator = stub.get();
  options.member_id = [&] { return worker_id; };
  options.watcher = &watcher;
  options.watch_poll_interval = absl::Seconds(60);
  options.timeout = absl::Seconds(3);
  auto subscriber = WeightSubscriber::Create(
      decoder, &source, [] { return std::string(); }, 0, options);
  REQUIRE(subscriber.ok());
  (*subscriber)->Start();

  // Catches up by pull (version 1), then reports it and waits.
  REQUIRE(WaitFor([&] { return watcher.watching(); }, absl::Seconds(10)));
  REQUIRE(WaitFor([&] { return (*subscriber)->received_version() == 1; },
                  absl::Seconds(20)));
  absl::SleepFor(absl::Milliseconds(300));

  // A new version on the weight server while it waits: the pull takes it
  // at once.
  absl::Time start = absl::Now();
  put(2);
  REQUIRE(WaitFor([&] { return (*subscriber)->received_version() == 2; },
                  absl::Seconds(5)));
  const absl::Duration version_took = absl::Now() - start;
  // It reports version 2 right after receiving it (a report stays fresh
  // for the coordinator's weight_sync.report_timeout_ms, 2 s).
  absl::SleepFor(absl::Seconds(1));

  // The coordinator forms an epoch listing it (caught up at 2): nothing
  // newer to pull, so only the epoch event can end its 60 s wait.
  start = absl::Now();
  const v1::BroadcastGroup group = announce(2);
  REQUIRE(group.member_ids_size() == 2);
  REQUIRE(group.member_ids(1) == worker_id);
  const bool joined = WaitFor(
      [&] { return (*subscriber)->sync_status().epoch == group.epoch(); },
      absl::Seconds(5));
  const absl::Duration join_took = absl::Now() - start;
  INFO("version 2 staged after "
       << absl::FormatDuration(version_took) << "; epoch " << group.epoch()
       << " joined after " << absl::FormatDuration(join_took));
  CHECK(version_took < absl::Seconds(2));
  CHECK(joined);
  CHECK(join_took < absl::Seconds(2));

  (*subscriber)->Stop();
  watcher.Stop();
  server->Shutdown();
  coordinator->Stop();
}

}  // namespace
}  // namespace tandem::rollout
