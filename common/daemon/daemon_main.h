#pragma once

// RunDaemon is the whole of a daemon's main(): parse flags and config, set up
// logging, Create, Start, wait for SIGTERM/SIGINT, GracefulStop within the
// drain deadline, exit 0. A daemon type D provides
//   static absl::StatusOr<std::unique_ptr<D>> Create(const C&);
//   absl::Status Start();  void GracefulStop(absl::Duration);
// and its config type C provides `server` (config::ServerOptions) plus free
// functions RegisterFields(ConfigSchema*, C*) and Validate(const C&).

#include <signal.h>
#include <string.h>

#include <iostream>
#include <string>

#include "common/base/logging.h"
#include "common/config/daemon_flags.h"
#include "common/daemon/daemon_runtime.h"

namespace tandem::daemon {

// Applies ServerOptions' log settings.
absl::Status InitDaemonLogging(const config::ServerOptions& options);

template <typename Daemon, typename Config>
int RunDaemon(int argc, char** argv, const std::string& name) {
  BlockTerminationSignals();
  IgnoreBrokenPipeSignal();
  Config config;
  config::ConfigSchema schema;
  RegisterFields(&schema, &config);
  const config::CommandLineResult parsed =
      config::LoadDaemonConfig(argc, argv, "tandem-" + name, &schema,
                               [&config] { return Validate(config); });
  if (!parsed.run) return parsed.exit_code;
  if (absl::Status s = InitDaemonLogging(config.server); !s.ok()) {
    std::cerr << "tandem-" << name << ": " << s.message() << "\n";
    return 2;
  }
  auto log = ComponentLogger(name);
  auto created = Daemon::Create(config);
  if (!created.ok()) {
    log->critical("cannot start: {}", created.status().ToString());
    return 1;
  }
  std::unique_ptr<Daemon> daemon = std::move(created).value();
  if (absl::Status s = daemon->Start(); !s.ok()) {
    log->critical("cannot start: {}", s.ToString());
    return 1;
  }
  const int signal_number = WaitForTerminationSignal();
  log->info("received {}; shutting down within {} ms", strsignal(signal_number),
            config.server.drain_timeout_ms);
  const absl::Time stop_start = absl::Now();
  daemon->GracefulStop(absl::Milliseconds(config.server.drain_timeout_ms));
  daemon.reset();
  log->info("exited cleanly (stopped in {:.2f} s)",
            absl::ToDoubleSeconds(absl::Now() - stop_start));
  return 0;
}

}  // namespace tandem::daemon
