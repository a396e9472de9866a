#include "services/rollout/rollout_worker.h"

#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

}  // namespace

RolloutWorker::RolloutWorker(const RolloutConfig& config)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_) {}

absl::StatusOr<std::unique_ptr<RolloutWorker>> RolloutWorker::Create(
    const RolloutConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<RolloutWorker> worker(new RolloutWorker(config));
  RolloutWorker* self = worker.get();
  ASSIGN_OR_RETURN(
      worker->member_,
      cluster::MemberDaemon::Create(
          "rollout", tandem::v1::ROLE_ROLLOUT, config.server,
          config.coordinator_address, worker->registry_, {self},
          [self](tandem::v1::HeartbeatRequest* r) { self->FillHeartbeat(r); },
          {{"max_num_seqs", std::to_string(config.max_num_seqs)}}));
  return worker;
}

RolloutWorker::~RolloutWorker() { Stop(); }

absl::Status RolloutWorker::Start() { return member_->Start(); }

void RolloutWorker::FillHeartbeat(tandem::v1::HeartbeatRequest* request) {
  absl::MutexLock lock(&mu_);
  request->set_policy_version(policy_version_);
  if (stopping_) request->set_state(tandem::v1::MEMBER_STATE_DRAINING);
}

void RolloutWorker::FillStatus(tandem::v1::RolloutStatus* status) {
  status->set_member_id(member_->session().member_id());
  absl::MutexLock lock(&mu_);
  status->set_state(state_);
  status->set_policy_version(policy_version_);
}

grpc::ServerUnaryReactor* RolloutWorker::SetState(
    grpc::CallbackServerContext* context, tandem::v1::RolloutState state,
    tandem::v1::RolloutStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (stopping_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "rollout worker is shutting down"));
    return reactor;
  }
  {
    absl::MutexLock lock(&mu_);
    if (state_ != state) {
      Log()->info("state {} -> {}", tandem::v1::RolloutState_Name(state_),
                  tandem::v1::RolloutState_Name(state));
    }
    state_ = state;
    metrics_.paused.Set(state == tandem::v1::ROLLOUT_STATE_RUNNING ? 0 : 1);
  }
  FillStatus(response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* RolloutWorker::GetStatus(
    grpc::CallbackServerContext* context,
    const tandem::v1::GetRolloutStatusRequest* request,
    tandem::v1::RolloutStatus* response) {
  FillStatus(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* RolloutWorker::Pause(
    grpc::CallbackServerContext* context,
    const tandem::v1::PauseRequest* request,
    tandem::v1::RolloutStatus* response) {
  return SetState(context, tandem::v1::ROLLOUT_STATE_PAUSED, response);
}

grpc::ServerUnaryReactor* RolloutWorker::Resume(
    grpc::CallbackServerContext* context,
    const tandem::v1::ResumeRequest* request,
    tandem::v1::RolloutStatus* response) {
  return SetState(context, tandem::v1::ROLLOUT_STATE_RUNNING, response);
}

grpc::ServerUnaryReactor* RolloutWorker::Drain(
    grpc::CallbackServerContext* context,
    const tandem::v1::DrainRequest* request,
    tandem::v1::RolloutStatus* response) {
  // Without an engine nothing is in flight, so a drain completes at once.
  return SetState(context, tandem::v1::ROLLOUT_STATE_DRAINED, response);
}

void RolloutWorker::GracefulStop(absl::Duration deadline) {
  stopping_ = true;
  member_->MarkNotServing();
  member_->Shutdown(deadline);
}

void RolloutWorker::Stop() {
  stopping_ = true;
  if (member_) member_->Shutdown(absl::ZeroDuration());
}

}  // namespace tandem::rollout
