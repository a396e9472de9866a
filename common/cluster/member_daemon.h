#pragma once

// MemberDaemon is the shell shared by the daemons that join a coordinator
// (rollout worker, verifier, trainer): a DaemonRuntime (gRPC + health +
// /metrics + ready file) plus a MemberSession that registers and heartbeats.
//
// Order: Start() serves first and then registers, so the coordinator only
// learns of a member that already answers; Shutdown() turns health
// NOT_SERVING, deregisters, then stops serving within the deadline.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster/member_session.h"
#include "common/config/config_schema.h"
#include "common/daemon/daemon_runtime.h"

namespace tandem::cluster {

// Where a member finds the coordinator; registered as `coordinator_address`
// (environment TANDEM_COORDINATOR_ADDRESS).
void AddCoordinatorAddress(config::ConfigSchema* schema, std::string* address);

class MemberDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<MemberDaemon>> Create(
      const std::string& name, tandem::v1::Role role,
      const config::ServerOptions& server,
      const std::string& coordinator_address,
      std::shared_ptr<prometheus::Registry> registry,
      const std::vector<grpc::Service*>& services,
      MemberSession::HeartbeatFiller filler,
      std::map<std::string, std::string> capabilities = {},
      std::function<void(const tandem::v1::DataPlaneSecret&,
                       absl::Duration)>
          on_data_plane_secret = nullptr,
      Clock* clock = RealClock());
  ~MemberDaemon();

  absl::Status Start();
  // Health NOT_SERVING (new work is refused by the daemon itself).
  void MarkNotServing();
  // Deregisters and stops serving, waiting up to `deadline` for in-flight
  // calls. Idempotent.
  void Shutdown(absl::Duration deadline);

  MemberSession& session() { return *session_; }
  const std::string& grpc_address() const { return runtime_->grpc_address(); }

 private:
  MemberDaemon() = default;
  std::string name_;
  std::unique_ptr<daemon::DaemonRuntime> runtime_;
  std::unique_ptr<MemberSession> session_;
  bool shut_down_ = false;
};

}  // namespace tandem::cluster
