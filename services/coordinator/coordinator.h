#pragma once

// The coordinator daemon: cluster membership (registration, heartbeats,
// expiry of silent members) and cluster status. Prompt leasing, sample
// intake, training batches and policy versions are served by later parts of
// this class as they land; their RPCs answer UNIMPLEMENTED until then.

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/daemon/daemon_runtime.h"
#include "services/coordinator/coordinator_config.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/member_registry.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::coordinator {

class Coordinator : public tandem::v1::Coordinator::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const CoordinatorConfig& config);
  ~Coordinator() override;

  // Starts the expiry loop and marks the daemon ready.
  absl::Status Start();
  // Health NOT_SERVING, refuses new registrations with UNAVAILABLE, lets
  // in-flight calls finish within `deadline`, then stops.
  void GracefulStop(absl::Duration deadline);
  // Stops at once. Idempotent.
  void Stop();

  const std::string& grpc_address() const { return runtime_->grpc_address(); }

  // tandem.v1.Coordinator
  grpc::ServerUnaryReactor* Register(
      grpc::CallbackServerContext* context,
      const tandem::v1::RegisterRequest* request,
      tandem::v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(
      grpc::CallbackServerContext* context,
      const tandem::v1::HeartbeatRequest* request,
      tandem::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(
      grpc::CallbackServerContext* context,
      const tandem::v1::DeregisterRequest* request,
      tandem::v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* GetClusterStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetClusterStatusRequest* request,
      tandem::v1::GetClusterStatusResponse* response) override;

 private:
  explicit Coordinator(const CoordinatorConfig& config);
  void ExpiryLoop();
  void UpdateMemberGauges();

  const CoordinatorConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  CoordinatorMetrics metrics_;
  MemberRegistry members_;
  std::unique_ptr<daemon::DaemonRuntime> runtime_;
  const absl::Time started_;

  std::atomic<bool> draining_{false};
  absl::Notification stop_expiry_;
  std::thread expiry_thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace tandem::coordinator
