#include "common/cluster/member_daemon.h"

#include "common/base/status_macros.h"

namespace tandem::cluster {

void AddCoordinatorAddress(config::ConfigSchema* schema, std::string* address) {
  schema->AddString("coordinator_address", address,
                    "host:port of the coordinator's gRPC server.");
}

absl::StatusOr<std::unique_ptr<MemberDaemon>> MemberDaemon::Create(
    const std::string& name, tandem::v1::Role role,
    const config::ServerOptions& server, const std::string& coordinator_address,
    std::shared_ptr<prometheus::Registry> registry,
    const std::vector<grpc::Service*>& services,
    MemberSession::HeartbeatFiller filler,
    std::map<std::string, std::string> capabilities,
    std::function<void(const tandem::v1::DataPlaneSecret&,
                       absl::Duration)>
        on_data_plane_secret,
    Clock* clock) {
  if (coordinator_address.empty()) {
    return absl::InvalidArgumentError("coordinator_address must be set");
  }
  std::unique_ptr<MemberDaemon> member(new MemberDaemon());
  member->name_ = name;
  ASSIGN_OR_RETURN(member->runtime_,
                   daemon::DaemonRuntime::Create(
                       name, server, std::move(registry), services));
  MemberSessionOptions options;
  options.coordinator_address = coordinator_address;
  options.tls = server.tls;
  options.role = role;
  options.grpc_address = member->runtime_->grpc_address();
  options.metrics_address = member->runtime_->metrics_address();
  options.capabilities = std::move(capabilities);
  options.on_data_plane_secret = std::move(on_data_plane_secret);
  options.clock = clock;
  member->session_ =
      std::make_unique<MemberSession>(std::move(options), std::move(filler));
  return member;
}

MemberDaemon::~MemberDaemon() { Shutdown(absl::ZeroDuration()); }

absl::Status MemberDaemon::Start() {
  RETURN_IF_ERROR(runtime_->MarkReady());
  session_->Start();
  return absl::OkStatus();
}

void MemberDaemon::MarkNotServing() { runtime_->MarkNotServing(); }

void MemberDaemon::Shutdown(absl::Duration deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  // Create may have failed half-way: only stop what exists.
  if (runtime_) runtime_->MarkNotServing();
  if (session_) session_->Stop(/*deregister=*/true, "shutdown");
  if (runtime_) runtime_->Shutdown(deadline);
}

}  // namespace tandem::cluster
