#include "services/trainer/trainer_service.h"

#include <utility>

#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/peer_identity.h"

namespace tandem::trainer {

tandem::v1::TrainerStatus TrainerStatusBoard::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void TrainerStatusBoard::Update(
    absl::FunctionRef<void(tandem::v1::TrainerStatus&)> update) {
  absl::MutexLock lock(&mu_);
  update(status_);
}

bool CheckpointRequestQueue::Add(Request request) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return false;
  requests_.push_back(request);
  return true;
}

void CheckpointRequestQueue::SetAccepting(bool accepting) {
  absl::MutexLock lock(&mu_);
  accepting_ = accepting;
}

std::vector<CheckpointRequestQueue::Request> CheckpointRequestQueue::TakeAll() {
  absl::MutexLock lock(&mu_);
  std::vector<Request> taken;
  taken.swap(requests_);
  return taken;
}

TrainerService::TrainerService(
    const TrainerStatusBoard* status, CheckpointRequestQueue* checkpoints,
    bool training_enabled, std::function<std::string()> member_id,
    bool tls_enabled, prometheus::Family<prometheus::Counter>* auth_refused)
    : status_(status),
      checkpoints_(checkpoints),
      training_enabled_(training_enabled),
      member_id_(std::move(member_id)),
      tls_enabled_(tls_enabled),
      auth_refused_(auth_refused) {}

grpc::ServerUnaryReactor* TrainerService::GetStatus(
    grpc::CallbackServerContext* context,
    const tandem::v1::GetTrainerStatusRequest* /*request*/,
    tandem::v1::TrainerStatus* response) {
  *response = status_->Snapshot();
  response->set_member_id(member_id_());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::SaveCheckpoint(
    grpc::CallbackServerContext* context,
    const tandem::v1::SaveCheckpointRequest* /*request*/,
    tandem::v1::SaveCheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // A checkpoint pins the weights on disk: an admin's call.
  if (absl::Status auth = rpc::AuthorizePeer(
          *context, tls_enabled_, "SaveCheckpoint", {rpc::PeerRole::kAdmin});
      !auth.ok()) {
    const char* reason = rpc::AuthRefusalReason(auth);
    auth_refused_->Add({{"reason", reason}}).Increment();
    ComponentLogger("trainer")->warn("refused SaveCheckpoint from {} ({}): {}",
                                     context->peer(), reason,
                                     std::string(auth.message()));
    reactor->Finish(rpc::ToGrpcStatus(auth));
    return reactor;
  }
  if (checkpoints_->Add({reactor, response})) return reactor;
  reactor->Finish(grpc::Status(
      training_enabled_ ? grpc::StatusCode::UNAVAILABLE
                        : grpc::StatusCode::FAILED_PRECONDITION,
      training_enabled_ ? "the trainer is stopping"
                        : "training is disabled (training.enabled: false): "
                          "nothing to checkpoint"));
  return reactor;
}

}  // namespace tandem::trainer
