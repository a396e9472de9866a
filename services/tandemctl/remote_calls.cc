#include "services/tandemctl/remote_calls.h"

#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/cluster/coordinator_client.h"
#include "tandem/v1/rollout.grpc.pb.h"

namespace tandem::ctl {

rpc::RetryPolicy CommandRetryPolicy(absl::Duration timeout, Clock* clock) {
  rpc::RetryPolicy policy;
  policy.attempt_timeout = timeout;
  policy.total_timeout = timeout;
  policy.clock = clock;
  return policy;
}

absl::Status GetClusterStatus(const std::string& coordinator,
                              const rpc::TlsOptions& tls,
                              const rpc::RetryPolicy& policy,
                              tandem::v1::GetClusterStatusResponse* response) {
  std::unique_ptr<cluster::CoordinatorClient> client =
      cluster::ConnectCoordinator(coordinator, tls);
  return rpc::CallWithRetry(
      "GetClusterStatus", policy, [&](grpc::ClientContext* context) {
        return client->GetClusterStatus(context, {}, response);
      });
}

absl::Status CallWorker(const std::string& action, const std::string& address,
                        const rpc::TlsOptions& tls,
                        const rpc::RetryPolicy& policy,
                        tandem::v1::RolloutStatus* response) {
  if (action != "status" && action != "pause" && action != "resume" &&
      action != "drain") {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker action must be status, pause, resume or drain, got '", action,
        "'"));
  }
  auto stub =
      tandem::v1::RolloutWorker::NewStub(rpc::MakeChannel(address, tls));
  std::function<grpc::Status(grpc::ClientContext*)> call;
  if (action == "status") {
    call = [&](grpc::ClientContext* c) {
      return stub->GetStatus(c, {}, response);
    };
  } else if (action == "pause") {
    tandem::v1::PauseRequest request;
    request.set_reason("tandemctl");
    call = [&, request](grpc::ClientContext* c) {
      return stub->Pause(c, request, response);
    };
  } else if (action == "resume") {
    call = [&](grpc::ClientContext* c) {
      return stub->Resume(c, {}, response);
    };
  } else {
    tandem::v1::DrainRequest request;
    request.set_reason("tandemctl");
    call = [&, request](grpc::ClientContext* c) {
      return stub->Drain(c, request, response);
    };
  }
  return rpc::CallWithRetry("worker " + action, policy, call);
}

}  // namespace tandem::ctl
