#include "services/trainer/trainer.h"

#include "common/base/status_macros.h"

namespace tandem::trainer {

Trainer::Trainer(const TrainerConfig& config)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      policy_version_(prometheus::BuildGauge()
                          .Name("tandem_policy_version")
                          .Help("Policy version of the trainer's weights.")
                          .Register(*registry_)
                          .Add({})) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Trainer> trainer(new Trainer(config));
  Trainer* self = trainer.get();
  ASSIGN_OR_RETURN(trainer->member_,
                   cluster::MemberDaemon::Create(
                       "trainer", tandem::v1::ROLE_TRAINER, config.server,
                       config.coordinator_address, trainer->registry_, {self},
                       [self](tandem::v1::HeartbeatRequest* r) {
                         r->set_policy_version(self->version_);
                         if (self->stopping_) {
                           r->set_state(tandem::v1::MEMBER_STATE_DRAINING);
                         }
                       }));
  return trainer;
}

Trainer::~Trainer() { Stop(); }

absl::Status Trainer::Start() { return member_->Start(); }

grpc::ServerUnaryReactor* Trainer::GetStatus(
    grpc::CallbackServerContext* context,
    const tandem::v1::GetTrainerStatusRequest* request,
    tandem::v1::TrainerStatus* response) {
  response->set_member_id(member_->session().member_id());
  response->set_policy_version(version_);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void Trainer::GracefulStop(absl::Duration deadline) {
  stopping_ = true;
  member_->MarkNotServing();
  member_->Shutdown(deadline);
}

void Trainer::Stop() {
  stopping_ = true;
  if (member_) member_->Shutdown(absl::ZeroDuration());
}

}  // namespace tandem::trainer
