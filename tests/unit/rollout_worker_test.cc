// The rollout worker daemon in process, against a real in-process
// coordinator, through its real gRPC surface: health is NOT_SERVING while
// the model loads and SERVING after; Drain finishes every in-flight
// sequence, delivers its samples and answers DRAINED. (The worker's lease
// and submit loops alone are tested against a scripted coordinator in
// rollout_lease_submit_test.)

#include "services/rollout/rollout_worker.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/coordinator/coordinator.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/rollout.grpc.pb.h"
#include "tests/support/wait_for.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

using grpc::health::v1::HealthCheckResponse;

struct Cluster {
  std::unique_ptr<coordinator::Coordinator> coordinator;
  std::unique_ptr<RolloutWorker> worker;
  std::unique_ptr<tandem::v1::RolloutWorker::Stub> control;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::unique_ptr<tandem::v1::Coordinator::Stub> coordinator_stub;

  Cluster() {
    coordinator::CoordinatorConfig cc;
    cc.server.metrics_address = "";
    cc.heartbeat_interval_ms = 200;
    // No trainer here: keep the staleness throttle from stopping dispatch.
    cc.training.groups_per_version = 100000;
    cc.group_size = 4;
    auto created = coordinator::Coordinator::Create(cc);
    REQUIRE(created.ok());
    coordinator = *std::move(created);
    REQUIRE(coordinator->Start().ok());
    coordinator_stub = tandem::v1::Coordinator::NewStub(grpc::CreateChannel(
        coordinator->grpc_address(), grpc::InsecureChannelCredentials()));

    RolloutConfig rc;
    rc.server.metrics_address = "";
    rc.coordinator_address = coordinator->grpc_address();
    rc.max_num_seqs = 8;
    rc.prefetch_prompts = 4;
    auto worker_created = RolloutWorker::Create(rc);
    REQUIRE(worker_created.ok());
    worker = *std::move(worker_created);
    auto channel = grpc::CreateChannel(worker->grpc_address(),
                                       grpc::InsecureChannelCredentials());
    control = tandem::v1::RolloutWorker::NewStub(channel);
    health = grpc::health::v1::Health::NewStub(channel);
  }

  ~Cluster() {
    worker->GracefulStop(absl::Seconds(5));
    coordinator->Stop();
  }

  HealthCheckResponse::ServingStatus Health() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    HealthCheckResponse response;
    grpc::Status status = health->Check(&context, request, &response);
    REQUIRE(status.ok());
    return response.status();
  }

  tandem::v1::RolloutStatus Status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    tandem::v1::RolloutStatus status;
    REQUIRE(control->GetStatus(&context, {}, &status).ok());
    return status;
  }

  grpc::Status Drain(absl::Duration deadline,
                     tandem::v1::RolloutStatus* status) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    tandem::v1::DrainRequest request;
    request.set_reason("test");
    return control->Drain(&context, request, status);
  }

  tandem::v1::QueueDepths Queues() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    tandem::v1::GetClusterStatusResponse status;
    REQUIRE(coordinator_stub->GetClusterStatus(&context, {}, &status).ok());
    return status.queues();
  }

  template <typename Predicate>
  bool WaitFor(Predicate predicate, absl::Duration timeout) {
    return ::tandem::testing::WaitFor(predicate, timeout);
  }
};

TEST_CASE(
    "Rollout worker: update_mode inplace with update_policy drain is refused "
    "at Create, naming both keys",
    "[rollout][worker]") {
  RolloutConfig rc;
  rc.server.metrics_address = "";
  rc.update_mode = "inplace";
  rc.update_policy = "drain";
  auto created = RolloutWorker::Create(rc);
  REQUIRE(!created.ok());
  CHECK(created.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(created.status().message())
            .find("engine.update_mode inplace needs engine.update_policy "
                  "inflight, got drain") != std::string::npos);
  rc.update_policy = "inflight";
  CHECK(RolloutWorker::Create(rc).ok());
}

TEST_CASE(
    "Rollout worker: health is NOT_SERVING and state LOADING while the "
    "model loads, SERVING and RUNNING once it is loaded",
    "[rollout][worker]") {
  Cluster cluster;
  absl::Notification release;
  cluster.worker->SetModelLoaderForTest(
      [&release]() -> absl::StatusOr<model::LoadedModel> {
        release.WaitForNotification();
        return model::LoadModel("", 1, 1);
      });
  REQUIRE(cluster.worker->Start().ok());

  // The server answers at once, while the model is still loading.
  CHECK(cluster.Health() == HealthCheckResponse::NOT_SERVING);
  CHECK(cluster.Status().state() == tandem::v1::ROLLOUT_STATE_LOADING);
  {
    grpc::ClientContext context;
    tandem::v1::RolloutStatus status;
    grpc::Status paused = cluster.control->Pause(&context, {}, &status);
    CHECK(paused.error_code() == grpc::StatusCode::UNAVAILABLE);
  }
  tandem::v1::RolloutStatus drained;
  CHECK(cluster.Drain(absl::Seconds(5), &drained).error_code() ==
        grpc::StatusCode::UNAVAILABLE);
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(cluster.Health() == HealthCheckResponse::NOT_SERVING);

  release.Notify();
  REQUIRE(cluster.WaitFor(
      [&] { return cluster.Health() == HealthCheckResponse::SERVING; },
      absl::Seconds(30)));
  CHECK(cluster.Status().state() == tandem::v1::ROLLOUT_STATE_RUNNING);
  // Registered only once loaded, and then it generates.
  CHECK(cluster.WaitFor(
      [&] { return cluster.Status().generated_tokens_total() > 0; },
      absl::Seconds(30)));
}

TEST_CASE(
    "Rollout worker: Drain over gRPC finishes in-flight sequences, delivers "
    "their samples, returns unstarted prompts and answers DRAINED",
    "[rollout][worker]") {
  Cluster cluster;
  REQUIRE(cluster.worker->Start().ok());
  REQUIRE(
      cluster.WaitFor([&] { return cluster.Status().running_sequences() > 0; },
                      absl::Seconds(60)));

  tandem::v1::RolloutStatus drained;
  grpc::Status status = cluster.Drain(absl::Seconds(60), &drained);
  REQUIRE(status.ok());
  CHECK(drained.state() == tandem::v1::ROLLOUT_STATE_DRAINED);
  CHECK(drained.running_sequences() == 0);
  CHECK(drained.waiting_sequences() == 0);
  CHECK(drained.prefetched_prompts() == 0);
  // Nothing is generated while drained.
  const uint64_t tokens = drained.generated_tokens_total();
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(cluster.Status().generated_tokens_total() == tokens);
  CHECK(cluster.Status().state() == tandem::v1::ROLLOUT_STATE_DRAINED);
  // Every lease ended: finished groups were delivered, unstarted prompts
  // were given back; none stays with the drained worker.
  CHECK(cluster.WaitFor([&] { return cluster.Queues().leased_prompts() == 0; },
                        absl::Seconds(5)));
  CHECK(cluster.Queues().scoring_samples() > 0);

  // Drain is idempotent: a drained worker answers at once.
  const absl::Time again = absl::Now();
  REQUIRE(cluster.Drain(absl::Seconds(60), &drained).ok());
  CHECK(drained.state() == tandem::v1::ROLLOUT_STATE_DRAINED);
  CHECK(absl::Now() - again < absl::Seconds(1));

  // Resume generates again.
  {
    grpc::ClientContext context;
    tandem::v1::RolloutStatus resumed;
    REQUIRE(cluster.control->Resume(&context, {}, &resumed).ok());
    CHECK(resumed.state() == tandem::v1::ROLLOUT_STATE_RUNNING);
  }
  CHECK(cluster.WaitFor(
      [&] { return cluster.Status().generated_tokens_total() > tokens; },
      absl::Seconds(30)));

  // A caller's short deadline gets an answer before it, not
  // DEADLINE_EXCEEDED: DRAINED if it got there in time, else DRAINING.
  REQUIRE(
      cluster.WaitFor([&] { return cluster.Status().running_sequences() > 0; },
                      absl::Seconds(60)));
  const absl::Time start = absl::Now();
  tandem::v1::RolloutStatus quick;
  REQUIRE(cluster.Drain(absl::Milliseconds(50), &quick).ok());
  CHECK(absl::Now() - start < absl::Milliseconds(50));
  CHECK((quick.state() == tandem::v1::ROLLOUT_STATE_DRAINING ||
         quick.state() == tandem::v1::ROLLOUT_STATE_DRAINED));
  REQUIRE(cluster.WaitFor(
      [&] {
        return cluster.Status().state() == tandem::v1::ROLLOUT_STATE_DRAINED;
      },
      absl::Seconds(60)));
}

}  // namespace
}  // namespace tandem::rollout
