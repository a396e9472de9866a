#pragma once

// The rollout worker daemon. This class owns the worker's control surface
// (status, pause, resume, drain) and its cluster membership; the generation
// engine plugs in behind it.

#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster/member_daemon.h"
#include "services/rollout/rollout_config.h"
#include "services/rollout/rollout_metrics.h"
#include "tandem/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

class RolloutWorker : public tandem::v1::RolloutWorker::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<RolloutWorker>> Create(
      const RolloutConfig& config);
  ~RolloutWorker() override;

  absl::Status Start();
  // Health NOT_SERVING, control calls refused with UNAVAILABLE, leaves the
  // cluster, stops serving within `deadline`.
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // tandem.v1.RolloutWorker
  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetRolloutStatusRequest* request,
      tandem::v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Pause(grpc::CallbackServerContext* context,
                                  const tandem::v1::PauseRequest* request,
                                  tandem::v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Resume(
      grpc::CallbackServerContext* context,
      const tandem::v1::ResumeRequest* request,
      tandem::v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const tandem::v1::DrainRequest* request,
                                  tandem::v1::RolloutStatus* response) override;

 private:
  explicit RolloutWorker(const RolloutConfig& config);
  void FillStatus(tandem::v1::RolloutStatus* status);
  void FillHeartbeat(tandem::v1::HeartbeatRequest* request);
  grpc::ServerUnaryReactor* SetState(grpc::CallbackServerContext* context,
                                     tandem::v1::RolloutState state,
                                     tandem::v1::RolloutStatus* response);

  const RolloutConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  RolloutMetrics metrics_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  tandem::v1::RolloutState state_ ABSL_GUARDED_BY(mu_) =
      tandem::v1::ROLLOUT_STATE_RUNNING;
  uint64_t policy_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::rollout
