#include "services/coordinator/coordinator.h"

#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_client.h"

namespace tandem::coordinator {
namespace {

auto Log() { return ComponentLogger("coordinator"); }

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

Coordinator::Coordinator(const CoordinatorConfig& config)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      members_(absl::Milliseconds(config.heartbeat_timeout_ms)),
      started_(absl::Now()) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Coordinator> coordinator(new Coordinator(config));
  ASSIGN_OR_RETURN(coordinator->runtime_,
                   daemon::DaemonRuntime::Create("coordinator", config.server,
                                                 coordinator->registry_,
                                                 {coordinator.get()}));
  return coordinator;
}

Coordinator::~Coordinator() { Stop(); }

absl::Status Coordinator::Start() {
  expiry_thread_ = std::thread([this] { ExpiryLoop(); });
  return runtime_->MarkReady();
}

void Coordinator::ExpiryLoop() {
  const absl::Duration period =
      std::max(absl::Milliseconds(config_.heartbeat_interval_ms) / 4,
               absl::Milliseconds(10));
  while (!stop_expiry_.WaitForNotificationWithTimeout(period)) {
    const absl::Time now = absl::Now();
    for (const auto& member : members_.ExpireSilent(now)) {
      Log()->warn(
          "member {} ({} at {}, pid {}) missed heartbeats for {} ms; declared "
          "dead",
          member.member_id(), RoleName(member.role()), member.grpc_address(),
          member.pid(), config_.heartbeat_timeout_ms);
      metrics_.CountExpired(member.role());
    }
    members_.Prune(now, absl::Milliseconds(config_.member_retention_ms));
    UpdateMemberGauges();
  }
}

void Coordinator::UpdateMemberGauges() {
  std::map<std::pair<int, int>, int> counts;
  for (const auto& member : members_.Snapshot()) {
    ++counts[{member.role(), member.state()}];
  }
  for (auto role : {tandem::v1::ROLE_ROLLOUT, tandem::v1::ROLE_VERIFIER,
                    tandem::v1::ROLE_TRAINER}) {
    for (auto state :
         {tandem::v1::MEMBER_STATE_ALIVE, tandem::v1::MEMBER_STATE_DRAINING,
          tandem::v1::MEMBER_STATE_DEAD, tandem::v1::MEMBER_STATE_LEFT}) {
      metrics_.SetMembers(role, state, counts[{role, state}]);
    }
  }
}

grpc::ServerUnaryReactor* Coordinator::Register(
    grpc::CallbackServerContext* context,
    const tandem::v1::RegisterRequest* request,
    tandem::v1::RegisterResponse* response) {
  if (draining_) {
    return Finish(context, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                        "coordinator is shutting down"));
  }
  if (request->role() == tandem::v1::ROLE_UNSPECIFIED) {
    return Finish(context,
                  grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "role must be set (rollout, verifier, trainer)"));
  }
  tandem::v1::MemberInfo info = members_.Register(*request, absl::Now());
  metrics_.CountRegistration(info.role());
  UpdateMemberGauges();
  Log()->info("registered {} (gRPC {}, metrics {}, pid {}{})",
              info.member_id(), info.grpc_address(), info.metrics_address(),
              info.pid(),
              request->previous_member_id().empty()
                  ? ""
                  : ", previously " + request->previous_member_id());
  response->set_member_id(info.member_id());
  response->set_heartbeat_interval_ms(config_.heartbeat_interval_ms);
  response->set_heartbeat_timeout_ms(config_.heartbeat_timeout_ms);
  response->set_group_size(config_.group_size);
  response->set_max_lag(config_.max_lag);
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Coordinator::Heartbeat(
    grpc::CallbackServerContext* context,
    const tandem::v1::HeartbeatRequest* request,
    tandem::v1::HeartbeatResponse* response) {
  absl::Status status = members_.Heartbeat(*request, absl::Now());
  return Finish(context, rpc::ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* Coordinator::Deregister(
    grpc::CallbackServerContext* context,
    const tandem::v1::DeregisterRequest* request,
    tandem::v1::DeregisterResponse* response) {
  absl::Status status = members_.Deregister(request->member_id());
  if (status.ok()) {
    Log()->info("member {} left ({})", request->member_id(),
                request->reason());
    UpdateMemberGauges();
  }
  return Finish(context, rpc::ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* Coordinator::GetClusterStatus(
    grpc::CallbackServerContext* context,
    const tandem::v1::GetClusterStatusRequest* request,
    tandem::v1::GetClusterStatusResponse* response) {
  for (auto& member : members_.Snapshot()) {
    *response->add_members() = std::move(member);
  }
  response->set_started_unix_ms(absl::ToUnixMillis(started_));
  response->set_max_lag(config_.max_lag);
  response->set_group_size(config_.group_size);
  return Finish(context, grpc::Status::OK);
}

void Coordinator::GracefulStop(absl::Duration deadline) {
  draining_ = true;
  runtime_->MarkNotServing();
  Log()->info("draining (deadline {})", absl::FormatDuration(deadline));
  runtime_->Shutdown(deadline);
  Stop();
}

void Coordinator::Stop() {
  if (stopped_.exchange(true)) return;
  if (!stop_expiry_.HasBeenNotified()) stop_expiry_.Notify();
  if (expiry_thread_.joinable()) expiry_thread_.join();
  if (runtime_) runtime_->Shutdown(absl::ZeroDuration());
  Log()->info("stopped");
}

}  // namespace tandem::coordinator
