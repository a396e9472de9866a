#include "common/cluster/coordinator_client.h"

#include "common/rpc/grpc_client.h"

namespace tandem::cluster {

grpc::Status GrpcCoordinatorClient::Register(
    grpc::ClientContext* context, const tandem::v1::RegisterRequest& request,
    tandem::v1::RegisterResponse* response) {
  return stub_->Register(context, request, response);
}

grpc::Status GrpcCoordinatorClient::Heartbeat(
    grpc::ClientContext* context, const tandem::v1::HeartbeatRequest& request,
    tandem::v1::HeartbeatResponse* response) {
  return stub_->Heartbeat(context, request, response);
}

grpc::Status GrpcCoordinatorClient::Deregister(
    grpc::ClientContext* context, const tandem::v1::DeregisterRequest& request,
    tandem::v1::DeregisterResponse* response) {
  return stub_->Deregister(context, request, response);
}

grpc::Status GrpcCoordinatorClient::LeasePrompts(
    grpc::ClientContext* context,
    const tandem::v1::LeasePromptsRequest& request,
    tandem::v1::LeasePromptsResponse* response) {
  return stub_->LeasePrompts(context, request, response);
}

grpc::Status GrpcCoordinatorClient::ReturnLeases(
    grpc::ClientContext* context,
    const tandem::v1::ReturnLeasesRequest& request,
    tandem::v1::ReturnLeasesResponse* response) {
  return stub_->ReturnLeases(context, request, response);
}

grpc::Status GrpcCoordinatorClient::SubmitSamples(
    grpc::ClientContext* context,
    const tandem::v1::SubmitSamplesRequest& request,
    tandem::v1::SubmitSamplesResponse* response) {
  return stub_->SubmitSamples(context, request, response);
}

grpc::Status GrpcCoordinatorClient::SyncWeightGroup(
    grpc::ClientContext* context,
    const tandem::v1::SyncWeightGroupRequest& request,
    tandem::v1::SyncWeightGroupResponse* response) {
  return stub_->SyncWeightGroup(context, request, response);
}

grpc::Status GrpcCoordinatorClient::PullTrainingBatch(
    grpc::ClientContext* context,
    const tandem::v1::PullTrainingBatchRequest& request,
    tandem::v1::PullTrainingBatchResponse* response) {
  return stub_->PullTrainingBatch(context, request, response);
}

grpc::Status GrpcCoordinatorClient::ReleaseTrainingBatch(
    grpc::ClientContext* context,
    const tandem::v1::ReleaseTrainingBatchRequest& request,
    tandem::v1::ReleaseTrainingBatchResponse* response) {
  return stub_->ReleaseTrainingBatch(context, request, response);
}

grpc::Status GrpcCoordinatorClient::PublishPolicyVersion(
    grpc::ClientContext* context,
    const tandem::v1::PublishPolicyVersionRequest& request,
    tandem::v1::PublishPolicyVersionResponse* response) {
  return stub_->PublishPolicyVersion(context, request, response);
}

grpc::Status GrpcCoordinatorClient::ResumeTraining(
    grpc::ClientContext* context,
    const tandem::v1::ResumeTrainingRequest& request,
    tandem::v1::ResumeTrainingResponse* response) {
  return stub_->ResumeTraining(context, request, response);
}

grpc::Status GrpcCoordinatorClient::GetClusterStatus(
    grpc::ClientContext* context,
    const tandem::v1::GetClusterStatusRequest& request,
    tandem::v1::GetClusterStatusResponse* response) {
  return stub_->GetClusterStatus(context, request, response);
}

namespace {

class GrpcClusterEventStream final : public ClusterEventStream {
 public:
  GrpcClusterEventStream(
      grpc::ClientContext* context,
      std::unique_ptr<grpc::ClientReader<tandem::v1::ClusterEvent>> reader)
      : context_(context), reader_(std::move(reader)) {}

  bool WaitUntilOpen() override {
    // The coordinator sends headers as soon as it accepts the stream; a
    // refused call ends here with its status.
    reader_->WaitForInitialMetadata();
    return context_->GetServerInitialMetadata().count(kWatchOpenMetadata) > 0;
  }
  bool Read(tandem::v1::ClusterEvent* event) override {
    return reader_->Read(event);
  }
  grpc::Status Finish() override { return reader_->Finish(); }

 private:
  grpc::ClientContext* const context_;
  const std::unique_ptr<grpc::ClientReader<tandem::v1::ClusterEvent>> reader_;
};

}  // namespace

std::unique_ptr<ClusterEventStream> GrpcCoordinatorClient::WatchCluster(
    grpc::ClientContext* context,
    const tandem::v1::WatchClusterRequest& request) {
  return std::make_unique<GrpcClusterEventStream>(
      context, stub_->WatchCluster(context, request));
}

std::unique_ptr<CoordinatorClient> ConnectCoordinator(
    const std::string& address, const rpc::TlsOptions& tls) {
  return std::make_unique<GrpcCoordinatorClient>(
      tandem::v1::Coordinator::NewStub(rpc::MakeChannel(address, tls)));
}

}  // namespace tandem::cluster
