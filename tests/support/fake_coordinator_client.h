#pragma once

// FakeCoordinatorClient: a CoordinatorClient whose answers a unit test
// scripts, for testing a daemon's own logic (what it sends, how it reacts
// to an answer) without starting a coordinator. Each RPC calls the
// test's handler for it (unset: UNIMPLEMENTED) and counts the call.
// Set the handlers before the code under test gets the fake; the handlers
// run on the caller's thread and must be thread-safe themselves. Test-only:
// integration tests keep real coordinators.

#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/cluster/coordinator_client.h"

namespace tandem::testing {

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
