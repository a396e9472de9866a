#include "common/daemon/daemon_runtime.h"

#include <signal.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem::daemon {

absl::StatusOr<std::unique_ptr<DaemonRuntime>> DaemonRuntime::Create(
    const std::string& daemon_name, const config::ServerOptions& options,
    std::shared_ptr<prometheus::Registry> registry,
    const std::vector<grpc::Service*>& services) {
  std::unique_ptr<DaemonRuntime> runtime(new DaemonRuntime());
  runtime->name_ = daemon_name;
  runtime->options_ = options;
  metrics::MetricsTls metrics_tls;
  metrics_tls.mode = options.metrics_tls;
  metrics_tls.cert = options.tls.cert;
  metrics_tls.key = options.tls.key;
  metrics_tls.ca = options.tls.ca;
  metrics_tls.refresh_s = options.tls.refresh_s;
  ASSIGN_OR_RETURN(runtime->metrics_,
                   metrics::MetricsServer::Create(options.metrics_address,
                                                  daemon_name,
                                                  std::move(registry),
                                                  metrics_tls));
  ASSIGN_OR_RETURN(
      runtime->grpc_,
      rpc::GrpcServer::Start(options.grpc_address, services, options.tls));
  ComponentLogger(daemon_name)
      ->info("serving gRPC on {} and metrics on {}{}", runtime->grpc_address(),
             runtime->metrics_address().empty() ? "(disabled)"
                                                : runtime->metrics_address(),
             metrics_tls.enabled() && !runtime->metrics_address().empty()
                 ? absl::StrCat(" (", metrics_tls.mode, ")")
                 : std::string());
  return runtime;
}

absl::Status DaemonRuntime::MarkReady() {
  grpc_->SetServing(true);
  if (!options_.ready_file.empty()) {
    RETURN_IF_ERROR(config::WriteReadyFile(options_.ready_file, grpc_address(),
                                           metrics_address()));
  }
  ComponentLogger(name_)->info("ready");
  return absl::OkStatus();
}

void DaemonRuntime::MarkNotServing() { grpc_->SetServing(false); }

void DaemonRuntime::Shutdown(absl::Duration deadline) {
  // The metrics HTTP server takes about a second to stop (its listener polls
  // on a timer), so it stops alongside gRPC rather than after it.
  if (stopped_) return;
  stopped_ = true;
  const absl::Time start = absl::Now();
  std::thread stop_metrics([this] { metrics_.reset(); });
  if (grpc_) grpc_->Shutdown(deadline);
  const absl::Duration grpc_took = absl::Now() - start;
  stop_metrics.join();
  ComponentLogger(name_)->info("servers stopped in {:.2f} s (gRPC {:.2f} s)",
                               absl::ToDoubleSeconds(absl::Now() - start),
                               absl::ToDoubleSeconds(grpc_took));
}

namespace {
sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void IgnoreBrokenPipeSignal() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  return signal_number;
}

}  // namespace tandem::daemon
