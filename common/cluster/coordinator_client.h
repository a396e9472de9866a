#pragma once

// CoordinatorClient: the coordinator's unary RPCs that a member daemon
// calls (membership, leases, samples, the weight group), behind an
// interface, so that a unit test of a daemon's own logic can answer them
// from a fake instead of starting a coordinator. The signatures are the
// generated stub's synchronous ones: the caller owns the ClientContext and
// sets its deadline (rpc::CallWithRetry hands each attempt a fresh one),
// and errors are gRPC status codes as the coordinator sends them.
// GrpcCoordinatorClient, over a Coordinator::Stub, is the only production
// implementation; integration tests keep real coordinators. The streaming
// WatchCluster stays on the stub (ClusterWatcher). Implementations are
// thread-safe: any thread may call any method.

#include <grpcpp/grpcpp.h>

#include <memory>

#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::cluster {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  virtual grpc::Status Register(grpc::ClientContext* context,
                                const tandem::v1::RegisterRequest& request,
                                tandem::v1::RegisterResponse* response) = 0;
  virtual grpc::Status Heartbeat(grpc::ClientContext* context,
                                 const tandem::v1::HeartbeatRequest& request,
                                 tandem::v1::HeartbeatResponse* response) = 0;
  virtual grpc::Status Deregister(grpc::ClientContext* context,
                                  const tandem::v1::DeregisterRequest& request,
                                  tandem::v1::DeregisterResponse* response) = 0;
  virtual grpc::Status LeasePrompts(
      grpc::ClientContext* context,
      const tandem::v1::LeasePromptsRequest& request,
      tandem::v1::LeasePromptsResponse* response) = 0;
  virtual grpc::Status ReturnLeases(
      grpc::ClientContext* context,
      const tandem::v1::ReturnLeasesRequest& request,
      tandem::v1::ReturnLeasesResponse* response) = 0;
  virtual grpc::Status SubmitSamples(
      grpc::ClientContext* context,
      const tandem::v1::SubmitSamplesRequest& request,
      tandem::v1::SubmitSamplesResponse* response) = 0;
  virtual grpc::Status SyncWeightGroup(
      grpc::ClientContext* context,
      const tandem::v1::SyncWeightGroupRequest& request,
      tandem::v1::SyncWeightGroupResponse* response) = 0;
};

// Each call goes to the coordinator over `stub` (not owned; it must
// outlive this object).
class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(tandem::v1::Coordinator::Stub* stub)
      : stub_(stub) {}

  grpc::Status Register(grpc::ClientContext* context,
                        const tandem::v1::RegisterRequest& request,
                        tandem::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ClientContext* context,
                         const tandem::v1::HeartbeatRequest& request,
                         tandem::v1::HeartbeatResponse* response) override;
  grpc::Status Deregister(grpc::ClientContext* context,
                          const tandem::v1::DeregisterRequest& request,
                          tandem::v1::DeregisterResponse* response) override;
  grpc::Status LeasePrompts(
      grpc::ClientContext* context,
      const tandem::v1::LeasePromptsRequest& request,
      tandem::v1::LeasePromptsResponse* response) override;
  grpc::Status ReturnLeases(
      grpc::ClientContext* context,
      const tandem::v1::ReturnLeasesRequest& request,
      tandem::v1::ReturnLeasesResponse* response) override;
  grpc::Status SubmitSamples(
      grpc::ClientContext* context,
      const tandem::v1::SubmitSamplesRequest& request,
      tandem::v1::SubmitSamplesResponse* response) override;
  grpc::Status SyncWeightGroup(
      grpc::ClientContext* context,
      const tandem::v1::SyncWeightGroupRequest& request,
      tandem::v1::SyncWeightGroupResponse* response) override;

 private:
  tandem::v1::Coordinator::Stub* const stub_;
};

}  // namespace tandem::cluster
