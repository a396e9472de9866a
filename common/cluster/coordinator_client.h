#pragma once

// CoordinatorClient: every coordinator RPC that a daemon calls
// (membership, leases, samples, training batches, policy versions, the
// weight group, cluster status and the WatchCluster stream), behind an
// interface, so that a unit test of a daemon's own logic can answer them
// from a fake instead of starting a coordinator. The signatures are the
// generated stub's synchronous ones: the caller owns the ClientContext and
// sets its deadline (rpc::CallWithRetry hands each attempt a fresh one),
// and errors are gRPC status codes as the coordinator sends them.
// GrpcCoordinatorClient, over a Coordinator::Stub, is the only production
// implementation; integration tests keep real coordinators. Daemons reach
// the coordinator only through this interface (MemberSession::client(),
// ConnectCoordinator). Implementations are thread-safe: any thread may
// call any method.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/rpc/tls_options.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::cluster {

// Initial-metadata key the coordinator sends when it accepts a WatchCluster
// stream.
inline constexpr char kWatchOpenMetadata[] = "tandem-watch-open";

// One WatchCluster stream. Used by one thread at a time; TryCancel() on
// the ClientContext it was opened with ends a blocked call.
class ClusterEventStream {
 public:
  virtual ~ClusterEventStream() = default;
  // Waits for the coordinator's headers: true when it accepted the stream
  // (kWatchOpenMetadata), false when the call was refused or broke (then
  // Finish() says why).
  virtual bool WaitUntilOpen() = 0;
  // The next event; false when the stream ended.
  virtual bool Read(tandem::v1::ClusterEvent* event) = 0;
  // REQUIRES: Read() returned false. How the stream ended.
  virtual grpc::Status Finish() = 0;
};

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
  virtual grpc::Status PullTrainingBatch(
      grpc::ClientContext* context,
      const tandem::v1::PullTrainingBatchRequest& request,
      tandem::v1::PullTrainingBatchResponse* response) = 0;
  virtual grpc::Status ReleaseTrainingBatch(
      grpc::ClientContext* context,
      const tandem::v1::ReleaseTrainingBatchRequest& request,
      tandem::v1::ReleaseTrainingBatchResponse* response) = 0;
  virtual grpc::Status PublishPolicyVersion(
      grpc::ClientContext* context,
      const tandem::v1::PublishPolicyVersionRequest& request,
      tandem::v1::PublishPolicyVersionResponse* response) = 0;
  virtual grpc::Status ResumeTraining(
      grpc::ClientContext* context,
      const tandem::v1::ResumeTrainingRequest& request,
      tandem::v1::ResumeTrainingResponse* response) = 0;
  virtual grpc::Status GetClusterStatus(
      grpc::ClientContext* context,
      const tandem::v1::GetClusterStatusRequest& request,
      tandem::v1::GetClusterStatusResponse* response) = 0;
  // The server stream; `context` must outlive the stream.
  virtual std::unique_ptr<ClusterEventStream> WatchCluster(
      grpc::ClientContext* context,
      const tandem::v1::WatchClusterRequest& request) = 0;
};

// Each call goes to the coordinator over one Coordinator::Stub.
class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  // `stub` is not owned; it must outlive this object.
  explicit GrpcCoordinatorClient(tandem::v1::Coordinator::Stub* stub)
      : stub_(stub) {}
  // Owns `stub`.
  explicit GrpcCoordinatorClient(
      std::unique_ptr<tandem::v1::Coordinator::Stub> stub)
      : owned_stub_(std::move(stub)), stub_(owned_stub_.get()) {}

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
  grpc::Status PullTrainingBatch(
      grpc::ClientContext* context,
      const tandem::v1::PullTrainingBatchRequest& request,
      tandem::v1::PullTrainingBatchResponse* response) override;
  grpc::Status ReleaseTrainingBatch(
      grpc::ClientContext* context,
      const tandem::v1::ReleaseTrainingBatchRequest& request,
      tandem::v1::ReleaseTrainingBatchResponse* response) override;
  grpc::Status PublishPolicyVersion(
      grpc::ClientContext* context,
      const tandem::v1::PublishPolicyVersionRequest& request,
      tandem::v1::PublishPolicyVersionResponse* response) override;
  grpc::Status ResumeTraining(
      grpc::ClientContext* context,
      const tandem::v1::ResumeTrainingRequest& request,
      tandem::v1::ResumeTrainingResponse* response) override;
  grpc::Status GetClusterStatus(
      grpc::ClientContext* context,
      const tandem::v1::GetClusterStatusRequest& request,
      tandem::v1::GetClusterStatusResponse* response) override;
  std::unique_ptr<ClusterEventStream> WatchCluster(
      grpc::ClientContext* context,
      const tandem::v1::WatchClusterRequest& request) override;

 private:
  const std::unique_ptr<tandem::v1::Coordinator::Stub> owned_stub_;
  tandem::v1::Coordinator::Stub* const stub_;
};

// A client over its own channel to the coordinator at `address` (host:port)
// with the TLS settings `tls` (for a caller without a MemberSession: a
// one-off status query, an observer's watch).
std::unique_ptr<CoordinatorClient> ConnectCoordinator(
    const std::string& address, const rpc::TlsOptions& tls);

}  // namespace tandem::cluster
