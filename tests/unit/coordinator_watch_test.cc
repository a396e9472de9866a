// WatchCluster against a real coordinator over loopback gRPC: the snapshot
// comes first, a publish and a new broadcast epoch are pushed, a watcher
// that does not read gets the newest version (coalesced) rather than every
// one, an unknown member gets NOT_FOUND, a graceful stop sends
// ShutdownEvent and ends the stream with OK. ClusterWatcher (the client)
// wakes on an event, notices a stopped coordinator, and reports no stream
// (watching() false) against a server that does not serve WatchCluster.
// On a FakeClock, the coordinator declares silent members dead only once
// heartbeat_timeout_ms has passed on its clock, and their leases go back.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cluster/cluster_watcher.h"
#include "services/coordinator/coordinator.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tests/support/fake_clock.h"

namespace tandem::coordinator {
namespace {

using tandem::v1::ClusterEvent;

struct Cluster {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<tandem::v1::Coordinator::Stub> stub;
  std::string trainer_id;
  uint64_t version = 0;

  explicit Cluster(const std::string& grpc_address = "127.0.0.1:0",
                   Clock* clock = RealClock()) {
    CoordinatorConfig config;
    config.server.grpc_address = grpc_address;
    config.server.metrics_address = "";
    config.training.groups_per_version = 100000;
    auto created = Coordinator::Create(config, clock);
    REQUIRE(created.ok());
    coordinator = *std::move(created);
    REQUIRE(coordinator->Start().ok());
    stub = tandem::v1::Coordinator::NewStub(grpc::CreateChannel(
        coordinator->grpc_address(), grpc::InsecureChannelCredentials()));
    // A trainer with a rendezvous store: each publish has a group.
    tandem::v1::RegisterRequest request;
    request.set_role(tandem::v1::ROLE_TRAINER);
    request.set_grpc_address("127.0.0.1:1");
    (*request.mutable_capabilities())["weight_broadcast_store"] = "127.0.0.1:2";
    trainer_id = Register(request);
  }
  ~Cluster() { coordinator->Stop(); }

  std::string Register(const tandem::v1::RegisterRequest& request) {
    tandem::v1::RegisterResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->Register(&context, request, &response).ok());
    return response.member_id();
  }

  // Publishes the next version; `padding` bytes of tensor names make the
  // event about that large.
  void Publish(size_t padding = 0) {
    tandem::v1::PublishPolicyVersionRequest request;
    request.set_member_id(trainer_id);
    request.mutable_manifest()->set_policy_version(++version);
    // Names within the coordinator's limit (kMaxTensorNameBytes).
    for (size_t left = padding; left > 0;) {
      const size_t n = std::min<size_t>(left, 1000);
      request.mutable_manifest()->add_tensors()->set_name(std::string(n, 'w'));
      left -= n;
    }
    request.set_weight_server_address("127.0.0.1:1");
    tandem::v1::PublishPolicyVersionResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->PublishPolicyVersion(&context, request, &response).ok());
  }
};

// One open WatchCluster call.
struct Watch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<ClusterEvent>> reader;

  Watch(tandem::v1::Coordinator::Stub* stub, const std::string& member_id) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    tandem::v1::WatchClusterRequest request;
    request.set_member_id(member_id);
    reader = stub->WatchCluster(&context, request);
  }
  ClusterEvent Next() {
    ClusterEvent event;
    REQUIRE(reader->Read(&event));
    return event;
  }
};

TEST_CASE("watch_cluster_sends_snapshot_then_publishes_and_new_epochs") {
  Cluster cluster;
  cluster.Publish();  // version 1 forms epoch 1 (the trainer alone)
  Watch watch(cluster.stub.get(), "");

  // Snapshot: the latest version, then the current epoch.
  ClusterEvent first = watch.Next();
  REQUIRE(first.has_policy_version());
  CHECK(first.policy_version().manifest().policy_version() == 1);
  CHECK(first.policy_version().weight_server_address() == "127.0.0.1:1");
  ClusterEvent second = watch.Next();
  REQUIRE(second.has_membership_epoch());
  CHECK(second.membership_epoch().group().epoch() == 1);

  // Same group: only the version is new.
  cluster.Publish();
  ClusterEvent v2 = watch.Next();
  REQUIRE(v2.has_policy_version());
  CHECK(v2.policy_version().manifest().policy_version() == 2);

  // A caught-up broadcast worker joins: version 3 forms epoch 2, announced
  // before the version it receives.
  tandem::v1::RegisterRequest worker;
  worker.set_role(tandem::v1::ROLE_ROLLOUT);
  worker.set_grpc_address("127.0.0.1:3");
  const std::string worker_id = cluster.Register(worker);
  tandem::v1::SyncWeightGroupRequest report;
  report.set_member_id(worker_id);
  report.set_policy_version(2);
  report.set_broadcast(true);
  tandem::v1::SyncWeightGroupResponse ignored;
  grpc::ClientContext context;
  REQUIRE(cluster.stub->SyncWeightGroup(&context, report, &ignored).ok());
  cluster.Publish();
  ClusterEvent epoch = watch.Next();
  REQUIRE(epoch.has_membership_epoch());
  CHECK(epoch.membership_epoch().group().epoch() == 2);
  REQUIRE(epoch.membership_epoch().group().member_ids_size() == 2);
  CHECK(epoch.membership_epoch().group().member_ids(1) == worker_id);
  CHECK(epoch.membership_epoch().group().first_policy_version() == 3);
  ClusterEvent v3 = watch.Next();
  REQUIRE(v3.has_policy_version());
  CHECK(v3.policy_version().manifest().policy_version() == 3);

  // A member may watch as itself.
  Watch as_member(cluster.stub.get(), worker_id);
  CHECK(as_member.Next().policy_version().manifest().policy_version() == 3);
  CHECK(as_member.Next().membership_epoch().group().epoch() == 2);
}

TEST_CASE("watch_cluster_coalesces_versions_for_a_watcher_that_does_not_read") {
  Cluster cluster;
  Watch slow(cluster.stub.get(), "");
  // 40 versions of 512 KiB events (20 MiB) while the watcher reads nothing:
  // far more than the transport's flow-control windows hold, so the
  // coordinator must not queue them all.
  constexpr int kVersions = 40;
  for (int i = 0; i < kVersions; ++i) cluster.Publish(512 << 10);
  std::vector<uint64_t> versions;
  while (versions.empty() || versions.back() < kVersions) {
    ClusterEvent event = slow.Next();
    if (event.has_policy_version()) {
      versions.push_back(event.policy_version().manifest().policy_version());
    }
  }
  INFO("versions received: " << versions.size());
  CHECK(versions.size() < kVersions);
  CHECK(std::is_sorted(versions.begin(), versions.end()));
  CHECK(versions.back() == kVersions);
}

TEST_CASE("watch_cluster_refuses_an_unknown_member_with_not_found") {
  Cluster cluster;
  Watch watch(cluster.stub.get(), "no-such-member");
  ClusterEvent event;
  CHECK_FALSE(watch.reader->Read(&event));
  grpc::Status status = watch.reader->Finish();
  CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK_THAT(status.error_message(),
             Catch::Contains("'no-such-member' is not registered"));
}

TEST_CASE("watch_cluster_sends_shutdown_and_ends_ok_on_graceful_stop") {
  Cluster cluster;
  Watch watch(cluster.stub.get(), "");
  cluster.Publish();
  CHECK(watch.Next().has_membership_epoch());
  CHECK(watch.Next().has_policy_version());
  std::thread stop(
      [&] { cluster.coordinator->GracefulStop(absl::Seconds(5)); });
  ClusterEvent event = watch.Next();
  CHECK(event.has_shutdown());
  CHECK(event.shutdown().reason() == "coordinator is shutting down");
  CHECK_FALSE(watch.reader->Read(&event));
  grpc::Status status = watch.reader->Finish();
  CHECK(status.ok());
  stop.join();
}

TEST_CASE("coordinator_declares_silent_members_dead_on_its_clock") {
  testing::FakeClock clock;
  Cluster cluster("127.0.0.1:0", &clock);  // heartbeat_timeout_ms 5000
  const absl::Time registered = clock.Now();
  tandem::v1::RegisterRequest worker;
  worker.set_role(tandem::v1::ROLE_ROLLOUT);
  worker.set_grpc_address("127.0.0.1:3");
  const std::string member = cluster.Register(worker);
  tandem::v1::LeasePromptsRequest lease;
  lease.set_member_id(member);
  lease.set_max_prompts(2);
  tandem::v1::LeasePromptsResponse leased;
  {
    grpc::ClientContext context;
    REQUIRE(cluster.stub->LeasePrompts(&context, lease, &leased).ok());
  }
  REQUIRE(leased.leases_size() > 0);
  auto status = [&] {
    tandem::v1::GetClusterStatusResponse response;
    grpc::ClientContext context;
    REQUIRE(cluster.stub
                ->GetClusterStatus(
                    &context, tandem::v1::GetClusterStatusRequest(), &response)
                .ok());
    return response;
  };
  CHECK(status().queues().leased_prompts() ==
        static_cast<uint64_t>(leased.leases_size()));
  // Neither the trainer nor the worker ever heartbeats. Nothing expires
  // while the clock stands still, however long the test takes ...
  clock.Advance(absl::Milliseconds(4900));
  CHECK(status().counters().members_expired() == 0);
  // ... and both are declared dead once 5 s have passed on the clock: the
  // worker's leases are back in the queue.
  REQUIRE(testing::AdvanceUntil(clock, absl::Milliseconds(50), [&] {
    return status().counters().members_expired() == 2;
  }));
  CHECK(clock.Now() - registered >= absl::Seconds(5));
  CHECK(status().queues().leased_prompts() == 0);
}

TEST_CASE("cluster_watcher_wakes_on_a_publish_and_notices_a_stopped_stream") {
  Cluster cluster;
  cluster::GrpcCoordinatorClient client(cluster.stub.get());
  cluster::ClusterWatcher watcher(&client, {});
  watcher.Start();
  // Stream open (headers), nothing to snapshot yet.
  const absl::Time open_by = absl::Now() + absl::Seconds(10);
  while (!watcher.watching() && absl::Now() < open_by) {
    watcher.WaitForChange(absl::Milliseconds(50));
  }
  REQUIRE(watcher.watching());
  watcher.WaitForChange(absl::ZeroDuration());  // clear the "opened" change
  CHECK_FALSE(watcher.WaitForChange(absl::Milliseconds(100)));

  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cluster.Publish();
  });
  const absl::Time start = absl::Now();
  CHECK(watcher.WaitForChange(absl::Seconds(20)));
  // Woken by the event, long before the 20 s wait ran out.
  CHECK(absl::Now() - start < absl::Seconds(5));
  publisher.join();
  CHECK(watcher.events_received() >= 1);

  // The coordinator stops: the stream ends (ShutdownEvent), a waiter is
  // woken and watching() turns false, so consumers go back to short polls.
  cluster.coordinator->GracefulStop(absl::Seconds(5));
  const absl::Time gone_by = absl::Now() + absl::Seconds(10);
  while (watcher.watching() && absl::Now() < gone_by) {
    watcher.WaitForChange(absl::Milliseconds(50));
  }
  CHECK_FALSE(watcher.watching());
  watcher.Stop();
}

TEST_CASE("cluster_watcher_reconnects_to_a_restarted_coordinator") {
  auto first = std::make_unique<Cluster>();
  const std::string address = first->coordinator->grpc_address();
  tandem::v1::RegisterRequest worker;
  worker.set_role(tandem::v1::ROLE_ROLLOUT);
  worker.set_grpc_address("127.0.0.1:3");
  absl::Mutex mu;
  std::string member = first->Register(worker);
  // The watcher's channel dials the address, whichever coordinator serves
  // it; a restarted worker registers again and gets a new member id.
  auto stub = tandem::v1::Coordinator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  cluster::ClusterWatcherOptions options;
  options.member_id = [&] {
    absl::MutexLock lock(&mu);
    return member;
  };
  options.max_backoff = absl::Milliseconds(200);
  cluster::GrpcCoordinatorClient client(stub.get());
  cluster::ClusterWatcher watcher(&client, options);
  watcher.Start();
  auto wait_watching = [&](bool want) {
    const absl::Time by = absl::Now() + absl::Seconds(10);
    while (watcher.watching() != want && absl::Now() < by) {
      watcher.WaitForChange(absl::Milliseconds(50));
    }
    return watcher.watching() == want;
  };
  REQUIRE(wait_watching(true));

  first->coordinator->GracefulStop(absl::Seconds(5));
  first.reset();
  REQUIRE(wait_watching(false));

  // A new coordinator on the same address does not know the old member id:
  // the watcher keeps retrying (NOT_FOUND) without a stream ...
  Cluster second(address);
  const absl::Time refused_by = absl::Now() + absl::Seconds(10);
  while (watcher.last_status().code() != absl::StatusCode::kNotFound &&
         absl::Now() < refused_by) {
    watcher.WaitForChange(absl::Milliseconds(20));
  }
  CHECK_FALSE(watcher.watching());
  CHECK(watcher.last_status().code() == absl::StatusCode::kNotFound);
  // ... until the worker has registered again.
  {
    std::string id = second.Register(worker);
    absl::MutexLock lock(&mu);
    member = id;
  }
  REQUIRE(wait_watching(true));
  const uint64_t before = watcher.events_received();
  watcher.WaitForChange(absl::ZeroDuration());  // clear the "opened" change
  second.Publish();
  CHECK(watcher.WaitForChange(absl::Seconds(20)));
  CHECK(watcher.events_received() > before);
  watcher.Stop();
}

TEST_CASE("cluster_watcher_reports_no_stream_when_watch_is_not_served") {
  // A real gRPC server whose Coordinator service implements nothing.
  tandem::v1::Coordinator::CallbackService unimplemented;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  auto stub = tandem::v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  cluster::GrpcCoordinatorClient client(stub.get());
  cluster::ClusterWatcher watcher(&client, {});
  watcher.Start();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (watcher.last_status().ok() && absl::Now() < until) {
    watcher.WaitForChange(absl::Milliseconds(20));
  }
  CHECK(watcher.last_status().code() == absl::StatusCode::kUnimplemented);
  CHECK_FALSE(watcher.watching());
  // No event: a wait runs its whole (short) course, so callers poll.
  const absl::Time start = absl::Now();
  CHECK_FALSE(watcher.WaitForChange(absl::Milliseconds(100)));
  CHECK(absl::Now() - start >= absl::Milliseconds(90));
  watcher.Stop();
  server->Shutdown();
}

}  // namespace
}  // namespace tandem::coordinator
