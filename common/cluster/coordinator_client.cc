#include "common/cluster/coordinator_client.h"

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

}  // namespace tandem::cluster
