#include "services/verifier/environment/environment_service.h"

#include <algorithm>

#include "boost/asio/post.hpp"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "services/verifier/environment/environment_request_limits.h"

namespace tandem::verifier {
namespace {

// Episodes are the rollout workers'; an admin may see what is offered.
constexpr rpc::PeerRoleSet kEpisodeRoles = {rpc::PeerRole::kRollout};
constexpr rpc::PeerRoleSet kListRoles = {rpc::PeerRole::kRollout,
                                         rpc::PeerRole::kAdmin};

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

EnvironmentService::EnvironmentService(
    const EnvironmentConfig& config,
    const std::map<std::string, std::unique_ptr<Scorer>>* scorers,
    prometheus::Registry& registry, int step_threads,
    absl::Duration score_timeout, bool tls_enabled,
    std::function<void(const char* reason)> refused, Clock* clock)
    : config_(config),
      tls_enabled_(tls_enabled),
      refused_(std::move(refused)),
      clock_(clock),
      metrics_(registry),
      table_(config, scorers, &metrics_, score_timeout, clock),
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
  while (!clock_->AwaitWithTimeout(&mu_, absl::Condition(&stop_), period)) {
    mu_.Unlock();
    table_.Reap(clock_->Now());
    mu_.Lock();
  }
}

absl::StatusOr<std::string> EnvironmentService::Caller(
    const grpc::CallbackServerContext& context, const char* rpc,
    rpc::PeerRoleSet allowed) const {
  if (!tls_enabled_) return std::string();
  absl::StatusOr<rpc::PeerIdentity> identity =
      rpc::AuthorizedPeerOf(context, rpc, allowed);
  if (!identity.ok()) {
    const char* reason = rpc::AuthRefusalReason(identity.status());
    if (refused_) refused_(reason);
    ComponentLogger("verifier")->warn(
        "refused {} from {} ({}): {}", rpc, context.peer(), reason,
        std::string(identity.status().message()));
    return identity.status();
  }
  return identity->uri;
}

absl::Status EnvironmentService::CountOwnerRefusal(
    const grpc::CallbackServerContext& context, absl::Status status) const {
  if (status.code() == absl::StatusCode::kPermissionDenied) {
    if (refused_) refused_("other_member");
    ComponentLogger("verifier")->warn("refused an episode call from {}: {}",
                                      context.peer(),
                                      std::string(status.message()));
  }
  return status;
}

grpc::ServerUnaryReactor* EnvironmentService::ListEnvironments(
    grpc::CallbackServerContext* context,
    const tandem::v1::ListEnvironmentsRequest* request,
    tandem::v1::ListEnvironmentsResponse* response) {
  absl::StatusOr<std::string> caller =
      Caller(*context, "ListEnvironments", kListRoles);
  if (!caller.ok()) return Finish(context, caller.status());
  for (tandem::v1::EnvironmentInfo& info : table_.List()) {
    *response->add_environments() = std::move(info);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* EnvironmentService::OpenEpisode(
    grpc::CallbackServerContext* context,
    const tandem::v1::OpenEpisodeRequest* request,
    tandem::v1::OpenEpisodeResponse* response) {
  absl::StatusOr<std::string> caller =
      Caller(*context, "OpenEpisode", kEpisodeRoles);
  if (!caller.ok()) return Finish(context, caller.status());
  if (absl::Status status = CheckEnvironmentRequestLimits(*request);
      !status.ok()) {
    return Finish(context, status);
  }
  absl::StatusOr<tandem::v1::OpenEpisodeResponse> opened =
      table_.Open(*request, *caller);
  if (opened.ok()) *response = std::move(*opened);
  return Finish(context, opened.status());
}

grpc::ServerUnaryReactor* EnvironmentService::Step(
    grpc::CallbackServerContext* context,
    const tandem::v1::StepRequest* request,
    tandem::v1::StepResponse* response) {
  absl::StatusOr<std::string> caller = Caller(*context, "Step", kEpisodeRoles);
  if (!caller.ok()) return Finish(context, caller.status());
  if (absl::Status status = CheckEnvironmentRequestLimits(*request);
      !status.ok()) {
    return Finish(context, status);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  boost::asio::post(pool_, [this, context, reactor, request, response,
                            caller = *std::move(caller)] {
    absl::StatusOr<tandem::v1::StepResponse> stepped =
        table_.Step(*request, caller);
    if (stepped.ok()) *response = std::move(*stepped);
    reactor->Finish(
        rpc::ToGrpcStatus(CountOwnerRefusal(*context, stepped.status())));
  });
  return reactor;
}

grpc::ServerUnaryReactor* EnvironmentService::CloseEpisode(
    grpc::CallbackServerContext* context,
    const tandem::v1::CloseEpisodeRequest* request,
    tandem::v1::CloseEpisodeResponse* response) {
  absl::StatusOr<std::string> caller =
      Caller(*context, "CloseEpisode", kEpisodeRoles);
  if (!caller.ok()) return Finish(context, caller.status());
  if (absl::Status status = CheckEnvironmentRequestLimits(*request);
      !status.ok()) {
    return Finish(context, status);
  }
  absl::StatusOr<bool> closed = table_.Close(request->episode_id(), *caller);
  if (closed.ok()) response->set_existed(*closed);
  return Finish(context, CountOwnerRefusal(*context, closed.status()));
}

}  // namespace tandem::verifier
