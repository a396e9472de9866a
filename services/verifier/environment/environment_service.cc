#include "services/verifier/environment/environment_service.h"

#include <algorithm>

#include "boost/asio/post.hpp"
#include "common/rpc/grpc_client.h"
#include "services/verifier/environment/environment_request_limits.h"

namespace tandem::verifier {

EnvironmentService::EnvironmentService(
    const EnvironmentConfig& config,
    const std::map<std::string, std::unique_ptr<Scorer>>* scorers,
    prometheus::Registry& registry, int step_threads,
    absl::Duration score_timeout)
    : config_(config),
      metrics_(registry),
      table_(config, scorers, &metrics_, score_timeout),
      pool_(static_cast<size_t>(std::max(1, step_threads))),
      reaper_([this] { ReapLoop(); }) {}

EnvironmentService::~EnvironmentService() { Stop(); }

void EnvironmentService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  reaper_.join();
  pool_.join();
}

void EnvironmentService::ReapLoop() {
  // A quarter of the idle timeout, so an idle episode lives at most 1.25x
  // idle_timeout_ms; at most once a second.
  const absl::Duration period = std::min(
      absl::Milliseconds(config_.idle_timeout_ms) / 4, absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) {
    mu_.Unlock();
    table_.Reap(absl::Now());
    mu_.Lock();
  }
}

grpc::ServerUnaryReactor* EnvironmentService::ListEnvironments(
    grpc::CallbackServerContext* context,
    const tandem::v1::ListEnvironmentsRequest* request,
    tandem::v1::ListEnvironmentsResponse* response) {
  for (tandem::v1::EnvironmentInfo& info : table_.List()) {
    *response->add_environments() = std::move(info);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* EnvironmentService::OpenEpisode(
    grpc::CallbackServerContext* context,
    const tandem::v1::OpenEpisodeRequest* request,
    tandem::v1::OpenEpisodeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = CheckEnvironmentRequestLimits(*request);
      !status.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(status));
    return reactor;
  }
  absl::StatusOr<tandem::v1::OpenEpisodeResponse> opened =
      table_.Open(*request);
  if (opened.ok()) *response = std::move(*opened);
  reactor->Finish(rpc::ToGrpcStatus(opened.status()));
  return reactor;
}

grpc::ServerUnaryReactor* EnvironmentService::Step(
    grpc::CallbackServerContext* context,
    const tandem::v1::StepRequest* request,
    tandem::v1::StepResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = CheckEnvironmentRequestLimits(*request);
      !status.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(status));
    return reactor;
  }
  boost::asio::post(pool_, [this, reactor, request, response] {
    absl::StatusOr<tandem::v1::StepResponse> stepped = table_.Step(*request);
    if (stepped.ok()) *response = std::move(*stepped);
    reactor->Finish(rpc::ToGrpcStatus(stepped.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* EnvironmentService::CloseEpisode(
    grpc::CallbackServerContext* context,
    const tandem::v1::CloseEpisodeRequest* request,
    tandem::v1::CloseEpisodeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = CheckEnvironmentRequestLimits(*request);
      !status.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(status));
    return reactor;
  }
  response->set_existed(table_.Close(request->episode_id()));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::verifier
