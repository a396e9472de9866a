#include "services/trainer/trainer_service.h"

#include <utility>

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

TrainerService::TrainerService(const TrainerStatusBoard* status,
                               CheckpointRequestQueue* checkpoints,
                               bool training_enabled,
                               std::function<std::string()> member_id)
    : status_(status),
      checkpoints_(checkpoints),
      training_enabled_(training_enabled),
      member_id_(std::move(member_id)) {}

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
