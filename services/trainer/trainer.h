#pragma once

// The trainer daemon: its control surface and cluster membership. The
// training loop and the weight server plug in behind it.

#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "common/cluster/member_daemon.h"
#include "prometheus/gauge.h"
#include "services/trainer/trainer_config.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

class Trainer : public tandem::v1::Trainer::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerConfig& config);
  ~Trainer() override;

  absl::Status Start();
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // tandem.v1.Trainer
  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetTrainerStatusRequest* request,
      tandem::v1::TrainerStatus* response) override;

 private:
  explicit Trainer(const TrainerConfig& config);

  const TrainerConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge& policy_version_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> version_{0};
};

}  // namespace tandem::trainer
