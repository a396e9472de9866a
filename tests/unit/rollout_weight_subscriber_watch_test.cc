// A broadcast-mode WeightSubscriber outside the broadcast group, with a
// ClusterWatcher streaming from a real coordinator over loopback gRPC and a
// real WeightServer: while the stream is open its pull waits a whole
// watch_poll_interval (60 s here) for a newer version, yet an epoch that
// lists it wakes it at once (the epoch event interrupts the pull's wait),
// and a new version still arrives at once (the pull waits for exactly that).
// A worker outside the group keeps its report fresh for the coordinator's
// report timeout, on a fake clock that coordinator, weight server, watcher
// and worker share (tests/support/fake_clock.h): no real-time sleep.

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_watcher.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "services/coordinator/coordinator.h"
#include "services/rollout/weight_subscriber.h"
#include "tests/support/fake_clock.h"
#include "tests/support/wait_for.h"
#include "tests/unit/model_test_util.h"
#include "tests/unit/silent_port.h"
#include "tests/unit/weight_server_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

using tandem::testing::SilentPort;

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

using ::tandem::testing::WaitFor;

// A coordinator (weight_sync.report_timeout_ms `report_timeout_ms`) whose
// trainer's rendezvous store never answers, the trainer's weight server,
// and one broadcast-mode worker with a ClusterWatcher whose watch interval
// is 60 s, all on `clock` (which outlives them).
class OutsideGroup {
 public:
  explicit OutsideGroup(int64_t report_timeout_ms, Clock* clock = RealClock())
      : clock_(clock), server_(&store_, {.clock = clock}) {
    coordinator::CoordinatorConfig config;
    config.server.grpc_address = "127.0.0.1:0";
    config.server.metrics_address = "";
    config.training.groups_per_version = 100000;
    config.heartbeat_timeout_ms = 600000;  // no heartbeats in this test
    config.weight_sync.report_timeout_ms = report_timeout_ms;
    auto created = coordinator::Coordinator::Create(config, clock_);
    REQUIRE(created.ok());
    coordinator_ = *std::move(created);
    REQUIRE(coordinator_->Start().ok());
    stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(
        coordinator_->grpc_address(), grpc::InsecureChannelCredentials()));
    client_ = std::make_unique<cluster::GrpcCoordinatorClient>(stub_.get());
    trainer_id_ = Register(v1::ROLE_TRAINER);
    worker_id_ = Register(v1::ROLE_ROLLOUT);
  }

  ~OutsideGroup() {
    if (subscriber_ != nullptr) subscriber_->Stop();
    if (watcher_ != nullptr) watcher_->Stop();
    coordinator_->Stop();
  }

  // The trainer stores `version` on its weight server (unless not
  // `on_server` yet) ...
  void Put(uint64_t version, bool on_server = true) {
    auto w = model::RandomInit(model_config_, 10 + version);
    REQUIRE(w.ok());
    std::shared_ptr<const std::vector<uint8_t>> flat;
    manifests_[version] = Manifest(**w, version, &flat);
    if (on_server) REQUIRE(store_.Put(manifests_[version], flat).ok());
  }

  // ... and announces it to the coordinator, which answers with the group
  // that receives it.
  v1::BroadcastGroup Announce(uint64_t version) {
    v1::PublishPolicyVersionRequest request;
    request.set_member_id(trainer_id_);
    *request.mutable_manifest() = manifests_.at(version);
    request.set_weight_server_address(server_.address());
    v1::PublishPolicyVersionResponse response;
    grpc::ClientContext context;
    REQUIRE(stub_->PublishPolicyVersion(&context, request, &response).ok());
    return response.group();
  }

  // Starts the worker; it catches up to `version` by pull.
  void StartWorker(uint64_t version) {
    auto initial = model::RandomInit(model_config_, 1);
    REQUIRE(initial.ok());
    decoder_ = std::make_shared<model::DecoderModel>(*initial);
    source_ = std::make_unique<StagedWeightSource>(decoder_);
    watcher_ = std::make_unique<cluster::ClusterWatcher>(
        client_.get(),
        cluster::ClusterWatcherOptions{
            .member_id = [this] { return worker_id_; }, .clock = clock_});
    watcher_->Start();
    WeightSyncOptions options;
    options.mode = WeightSyncOptions::Mode::kBroadcast;
    // Through the coordinator, remembering the newest version reported.
    options.sync_weight_group =
        [this, via = SyncWeightGroupVia(client_.get())](
            const v1::SyncWeightGroupRequest& request,
            v1::SyncWeightGroupResponse* response) {
          grpc::Status status = via(request, response);
          if (status.ok()) ++reports_;
          if (status.ok() && request.policy_version() > reported_) {
            reported_ = request.policy_version();
          }
          return status;
        };
    options.member_id = [this] { return worker_id_; };
    options.watcher = watcher_.get();
    options.watch_poll_interval = absl::Seconds(60);
    options.timeout = absl::Seconds(3);
    options.clock = clock_;
    auto subscriber =
        WeightSubscriber::Create(decoder_, source_.get(), 0, options);
    REQUIRE(subscriber.ok());
    subscriber_ = *std::move(subscriber);
    subscriber_->Start();
    REQUIRE(WaitFor([&] { return watcher_->watching(); }, absl::Seconds(10)));
    REQUIRE(WaitFor([&] { return subscriber_->received_version() == version; },
                    absl::Seconds(20)));
  }

  WeightSubscriber& subscriber() { return *subscriber_; }
  const std::string& worker_id() const { return worker_id_; }
  // The newest version the worker has reported holding to the coordinator
  // (answered).
  uint64_t reported() const { return reported_; }
  // How many reports the coordinator answered.
  int reports() const { return reports_; }
  // Pulls of the worker that the weight server holds now, waiting for a
  // newer version.
  int held_pulls() { return server_.service().held_long_polls(); }

 private:
  std::string Register(v1::Role role) {
    v1::RegisterRequest request;
    request.set_role(role);
    request.set_grpc_address("127.0.0.1:1");
    if (role == v1::ROLE_TRAINER) {
      (*request.mutable_capabilities())["weight_broadcast_store"] =
          absl::StrCat("127.0.0.1:", store_port_.port());
    }
    v1::RegisterResponse response;
    grpc::ClientContext context;
    REQUIRE(stub_->Register(&context, request, &response).ok());
    return response.member_id();
  }

  Clock* const clock_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<cluster::GrpcCoordinatorClient> client_;
  SilentPort store_port_;
  std::string trainer_id_, worker_id_;
  weights::WeightStore store_{4};
  weights::testing::WeightServerLoopback server_;
  const model::ModelConfig model_config_ = model::testing::TinyQwen2Config();
  std::map<uint64_t, v1::WeightManifest> manifests_;
  std::shared_ptr<model::DecoderModel> decoder_;
  std::unique_ptr<StagedWeightSource> source_;
  std::unique_ptr<cluster::ClusterWatcher> watcher_;
  std::unique_ptr<WeightSubscriber> subscriber_;
  // Written by the subscriber's thread only.
  std::atomic<uint64_t> reported_{0};
  std::atomic<int> reports_{0};
};

TEST_CASE(
    "a worker outside the group waits long, yet joins a new epoch listing "
    "it at once") {
  // A report stays fresh for 10 min: the worker's waits are its own 60 s.
  OutsideGroup cluster(600000);
  cluster.Put(1);
  // Epoch 1: the trainer alone (the worker has not reported yet).
  REQUIRE(cluster.Announce(1).member_ids_size() == 1);
  // Catches up by pull (version 1), then reports it and waits.
  cluster.StartWorker(1);
  REQUIRE(WaitFor([&] { return cluster.reported() == 1; }, absl::Seconds(10)));

  // A new version on the weight server while it waits: the pull takes it
  // at once.
  absl::Time start = absl::Now();
  cluster.Put(2);
  REQUIRE(WaitFor([&] { return cluster.subscriber().received_version() == 2; },
                  absl::Seconds(5)));
  const absl::Duration version_took = absl::Now() - start;
  // It reports version 2 right after receiving it; wait for that report
  // (the coordinator lists only workers caught up at the version).
  REQUIRE(WaitFor([&] { return cluster.reported() == 2; }, absl::Seconds(10)));

  // The coordinator forms an epoch listing it (caught up at 2): nothing
  // newer to pull, so only the epoch event can end its 60 s wait.
  start = absl::Now();
  const v1::BroadcastGroup group = cluster.Announce(2);
  REQUIRE(group.member_ids_size() == 2);
  REQUIRE(group.member_ids(1) == cluster.worker_id());
  const bool joined = WaitFor(
      [&] { return cluster.subscriber().sync_status().epoch == group.epoch(); },
      absl::Seconds(5));
  const absl::Duration join_took = absl::Now() - start;
  INFO("version 2 staged after "
       << absl::FormatDuration(version_took) << "; epoch " << group.epoch()
       << " joined after " << absl::FormatDuration(join_took));
  CHECK(version_took < absl::Seconds(2));
  CHECK(joined);
  CHECK(join_took < absl::Seconds(2));
}

TEST_CASE(
    "a worker outside the group reports at least twice per the "
    "coordinator's report timeout, however long its own watch interval") {
  // Reports older than 20 s on the shared clock do not count; the worker's
  // watch interval is 60 s, so without the coordinator's hint its last
  // report (right after catching up) would be stale when the next version
  // is announced.
  testing::FakeClock clock;
  const absl::Duration report_timeout = absl::Seconds(20);
  OutsideGroup cluster(absl::ToInt64Milliseconds(report_timeout), &clock);
  cluster.Put(1);
  REQUIRE(cluster.Announce(1).member_ids_size() == 1);
  cluster.StartWorker(1);
  // No events for three report timeouts: only its own reports keep it
  // fresh. Each time its pull waits on the weight server for a newer
  // version, time moves half a report timeout, and it reports again.
  for (int i = 0; i < 6; ++i) {
    INFO("after " << i << " half report timeouts");
    REQUIRE(WaitFor([&] { return cluster.held_pulls() == 1; },
                    absl::Seconds(10)));
    const int reports = cluster.reports();
    clock.Advance(report_timeout / 2);
    REQUIRE(WaitFor([&] { return cluster.reports() > reports; },
                    absl::Seconds(10)));
  }
  // Then version 2 is announced (not yet on the weight server, so no pull
  // wakes the worker first).
  cluster.Put(2, /*on_server=*/false);
  const v1::BroadcastGroup group = cluster.Announce(2);
  INFO("epoch " << group.epoch() << " lists " << group.member_ids_size());
  REQUIRE(group.member_ids_size() == 2);
  CHECK(group.member_ids(1) == cluster.worker_id());
  CHECK(WaitFor(
      [&] { return cluster.subscriber().sync_status().epoch == group.epoch(); },
      absl::Seconds(5)));
}

}  // namespace
}  // namespace tandem::rollout
