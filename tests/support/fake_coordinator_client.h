#pragma once

// FakeCoordinatorClient: a CoordinatorClient whose answers a unit test
// scripts, for testing a daemon's own logic (what it sends, how it reacts
// to an answer) without starting a coordinator. Each RPC calls the
// test's handler for it (unset: UNIMPLEMENTED; for WatchCluster a stream
// that ends at once with UNIMPLEMENTED) and counts the call.
// Set the handlers before the code under test gets the fake; the handlers
// run on the caller's thread and must be thread-safe themselves. Test-only:
// integration tests keep real coordinators.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/cluster/coordinator_client.h"

namespace tandem::testing {

// A WatchCluster stream that opens (when `open`), yields `events` and then
// ends with `status`.
class FakeClusterEventStream final : public cluster::ClusterEventStream {
 public:
  FakeClusterEventStream(bool open,
                         std::vector<tandem::v1::ClusterEvent> events,
                         grpc::Status status)
      : open_(open), events_(std::move(events)), status_(std::move(status)) {}

  bool WaitUntilOpen() override { return open_; }
  bool Read(tandem::v1::ClusterEvent* event) override {
    if (next_ >= events_.size()) return false;
    *event = events_[next_++];
    return true;
  }
  grpc::Status Finish() override { return status_; }

 private:
  const bool open_;
  const std::vector<tandem::v1::ClusterEvent> events_;
  const grpc::Status status_;
  size_t next_ = 0;
};

class FakeCoordinatorClient final : public cluster::CoordinatorClient {
 public:
  template <typename Request, typename Response>
  using Handler = std::function<grpc::Status(const Request&, Response*)>;

  Handler<tandem::v1::RegisterRequest, tandem::v1::RegisterResponse>
      on_register;
  Handler<tandem::v1::HeartbeatRequest, tandem::v1::HeartbeatResponse>
      on_heartbeat;
  Handler<tandem::v1::DeregisterRequest, tandem::v1::DeregisterResponse>
      on_deregister;
  Handler<tandem::v1::LeasePromptsRequest, tandem::v1::LeasePromptsResponse>
      on_lease_prompts;
  Handler<tandem::v1::ReturnLeasesRequest, tandem::v1::ReturnLeasesResponse>
      on_return_leases;
  Handler<tandem::v1::SubmitSamplesRequest, tandem::v1::SubmitSamplesResponse>
      on_submit_samples;
  Handler<tandem::v1::SyncWeightGroupRequest,
          tandem::v1::SyncWeightGroupResponse>
      on_sync_weight_group;
  Handler<tandem::v1::PullTrainingBatchRequest,
          tandem::v1::PullTrainingBatchResponse>
      on_pull_training_batch;
  Handler<tandem::v1::ReleaseTrainingBatchRequest,
          tandem::v1::ReleaseTrainingBatchResponse>
      on_release_training_batch;
  Handler<tandem::v1::PublishPolicyVersionRequest,
          tandem::v1::PublishPolicyVersionResponse>
      on_publish_policy_version;
  Handler<tandem::v1::ResumeTrainingRequest, tandem::v1::ResumeTrainingResponse>
      on_resume_training;
  Handler<tandem::v1::GetClusterStatusRequest,
          tandem::v1::GetClusterStatusResponse>
      on_get_cluster_status;
  std::function<std::unique_ptr<cluster::ClusterEventStream>(
      const tandem::v1::WatchClusterRequest&)>
      on_watch_cluster;

  // Calls of the RPC named `method` ("LeasePrompts", ...) so far.
  int calls(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

  grpc::Status Register(grpc::ClientContext*,
                        const tandem::v1::RegisterRequest& request,
                        tandem::v1::RegisterResponse* response) override {
    return Answer("Register", on_register, request, response);
  }
  grpc::Status Heartbeat(grpc::ClientContext*,
                         const tandem::v1::HeartbeatRequest& request,
                         tandem::v1::HeartbeatResponse* response) override {
    return Answer("Heartbeat", on_heartbeat, request, response);
  }
  grpc::Status Deregister(grpc::ClientContext*,
                          const tandem::v1::DeregisterRequest& request,
                          tandem::v1::DeregisterResponse* response) override {
    return Answer("Deregister", on_deregister, request, response);
  }
  grpc::Status LeasePrompts(
      grpc::ClientContext*, const tandem::v1::LeasePromptsRequest& request,
      tandem::v1::LeasePromptsResponse* response) override {
    return Answer("LeasePrompts", on_lease_prompts, request, response);
  }
  grpc::Status ReturnLeases(
      grpc::ClientContext*, const tandem::v1::ReturnLeasesRequest& request,
      tandem::v1::ReturnLeasesResponse* response) override {
    return Answer("ReturnLeases", on_return_leases, request, response);
  }
  grpc::Status SubmitSamples(
      grpc::ClientContext*, const tandem::v1::SubmitSamplesRequest& request,
      tandem::v1::SubmitSamplesResponse* response) override {
    return Answer("SubmitSamples", on_submit_samples, request, response);
  }
  grpc::Status SyncWeightGroup(
      grpc::ClientContext*, const tandem::v1::SyncWeightGroupRequest& request,
      tandem::v1::SyncWeightGroupResponse* response) override {
    return Answer("SyncWeightGroup", on_sync_weight_group, request, response);
  }
  grpc::Status PullTrainingBatch(
      grpc::ClientContext*, const tandem::v1::PullTrainingBatchRequest& request,
      tandem::v1::PullTrainingBatchResponse* response) override {
    return Answer("PullTrainingBatch", on_pull_training_batch, request,
                  response);
  }
  grpc::Status ReleaseTrainingBatch(
      grpc::ClientContext*,
      const tandem::v1::ReleaseTrainingBatchRequest& request,
      tandem::v1::ReleaseTrainingBatchResponse* response) override {
    return Answer("ReleaseTrainingBatch", on_release_training_batch, request,
                  response);
  }
  grpc::Status PublishPolicyVersion(
      grpc::ClientContext*,
      const tandem::v1::PublishPolicyVersionRequest& request,
      tandem::v1::PublishPolicyVersionResponse* response) override {
    return Answer("PublishPolicyVersion", on_publish_policy_version, request,
                  response);
  }
  grpc::Status ResumeTraining(
      grpc::ClientContext*, const tandem::v1::ResumeTrainingRequest& request,
      tandem::v1::ResumeTrainingResponse* response) override {
    return Answer("ResumeTraining", on_resume_training, request, response);
  }
  grpc::Status GetClusterStatus(
      grpc::ClientContext*, const tandem::v1::GetClusterStatusRequest& request,
      tandem::v1::GetClusterStatusResponse* response) override {
    return Answer("GetClusterStatus", on_get_cluster_status, request, response);
  }
  std::unique_ptr<cluster::ClusterEventStream> WatchCluster(
      grpc::ClientContext*,
      const tandem::v1::WatchClusterRequest& request) override {
    {
      absl::MutexLock lock(&mu_);
      ++calls_["WatchCluster"];
    }
    if (!on_watch_cluster) {
      return std::make_unique<FakeClusterEventStream>(
          false, std::vector<tandem::v1::ClusterEvent>{},
          grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                       "WatchCluster is not scripted in this test"));
    }
    return on_watch_cluster(request);
  }

 private:
  template <typename Request, typename Response>
  grpc::Status Answer(const std::string& method,
                      const Handler<Request, Response>& handler,
                      const Request& request, Response* response) {
    {
      absl::MutexLock lock(&mu_);
      ++calls_[method];
    }
    if (!handler) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          method + " is not scripted in this test");
    }
    return handler(request, response);
  }

  mutable absl::Mutex mu_;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::testing
