#pragma once

// DaemonRuntime is the serving shell every Tandem daemon is built from: a
// Prometheus registry with its /metrics endpoint, a gRPC server with health
// and reflection, and the ready file. A daemon class owns one and adds its
// own services and logic; the runtime fixes the start and shutdown order:
//
//   Create: bind /metrics, bind gRPC (health NOT_SERVING)
//   MarkReady: health SERVING, write the ready file
//   Shutdown: health NOT_SERVING, stop gRPC with a deadline, stop /metrics

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/daemon_flags.h"
#include "common/metrics/metrics_server.h"
#include "common/rpc/grpc_server.h"
#include "prometheus/registry.h"

namespace tandem::daemon {

class DaemonRuntime {
 public:
  // `registry` must already hold the daemon's metric families so the first
  // scrape sees them. `services` must outlive the runtime.
  static absl::StatusOr<std::unique_ptr<DaemonRuntime>> Create(
      const std::string& daemon_name, const config::ServerOptions& options,
      std::shared_ptr<prometheus::Registry> registry,
      const std::vector<grpc::Service*>& services);

  // Health to SERVING and the ready file written (if configured).
  absl::Status MarkReady();
  // Health to NOT_SERVING without stopping (first step of a drain).
  void MarkNotServing();
  // Stops gRPC (waiting up to `deadline` for in-flight calls) and /metrics.
  // Idempotent.
  void Shutdown(absl::Duration deadline);

  const std::string& grpc_address() const { return grpc_->bound_address(); }
  const std::string& metrics_address() const {
    return metrics_->bound_address();
  }

 private:
  DaemonRuntime() = default;
  std::string name_;
  config::ServerOptions options_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<rpc::GrpcServer> grpc_;
  bool stopped_ = false;
};

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread; call in main()
// before any thread starts so every thread inherits the mask.
void BlockTerminationSignals();

// Ignores SIGPIPE for the whole process: a write to a socket whose peer
// died returns EPIPE to the code that wrote instead of killing the daemon.
// Gloo's pair sockets write without MSG_NOSIGNAL, so a rollout worker
// killed during a broadcast could otherwise take the trainer down with it
// (seen as a SIGPIPE death in weights_gloo_dying_peer_test). Programs the
// daemons start reset it (the verifier's sandbox, ResetSignals).
void IgnoreBrokenPipeSignal();
// Waits for one of the blocked signals and returns its number.
int WaitForTerminationSignal();

}  // namespace tandem::daemon
