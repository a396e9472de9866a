#pragma once

// Command line and configuration loading shared by every daemon's main().
//
//   tandem-X [--config FILE] [--set key=value]... [--grpc-address HOST:PORT]
//            [--metrics-address HOST:PORT] [--ready-file PATH]
//            [--print-config]
//
// Layering: the struct's defaults, then FILE, then TANDEM_* environment
// variables, then --set overrides, then the dedicated address flags.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/config_schema.h"
#include "common/rpc/tls_options.h"

namespace tandem::config {

// Settings every daemon has: where it serves and how it logs.
struct ServerOptions {
  // host:port for gRPC; port 0 picks a free port.
  std::string grpc_address = "127.0.0.1:0";
  // host:port for the Prometheus /metrics endpoint; port 0 picks a free
  // port; empty disables it.
  std::string metrics_address = "127.0.0.1:0";
  // When set, the bound addresses are written here as JSON once serving.
  std::string ready_file;
  std::string log_level = "info";
  std::string log_format = "text";
  // How long SIGTERM waits for in-flight work before forcing shutdown.
  int64_t drain_timeout_ms = 10000;
  // TLS of the gRPC server and of every gRPC client of the daemon.
  rpc::TlsOptions tls;
  // TLS of the /metrics endpoint: "off" (plain HTTP), "tls" (HTTPS with
  // tls.cert and tls.key) or "mtls" (scrapers also present a certificate
  // of tls.ca), whatever tls.mode says.
  std::string metrics_tls = "off";
};

// Registers the ServerOptions keys (grpc_address, metrics_address,
// metrics.tls, ready_file, log.level, log.format, drain_timeout_ms, tls.*).
void AddServerOptions(ConfigSchema* schema, ServerOptions* options);

// Registers tls.mode, tls.cert, tls.key, tls.ca, tls.server_name and
// tls.refresh_s (environment TANDEM_TLS_MODE, TANDEM_TLS_CERT, ...) and the
// checks ConfigSchema::Check runs on them: with mode mtls, cert, key and ca
// are set, readable, parse as PEM, and the key belongs to the certificate.
void AddTlsOptions(ConfigSchema* schema, rpc::TlsOptions* tls);

// The host part of a host:port address ("0.0.0.0:50051" -> "0.0.0.0",
// "[::]:0" -> "::"); the whole string when it has no port.
std::string HostOfAddress(const std::string& address);

// A host peers can dial to reach this daemon: HostOfAddress(address), or
// 127.0.0.1 when that is a wildcard ("0.0.0.0", "::") or empty, since a
// wildcard cannot be advertised. For the weight-sync sockets that follow
// grpc_address, so that a daemon in a container or pod (grpc_address = its
// own IP) is reachable by the others without extra settings.
std::string ReachableHostOf(const std::string& address);

// What main() should do after parsing.
struct CommandLineResult {
  bool run = false;  // false: exit with exit_code (help, --print-config, error)
  int exit_code = 0;
};

// Parses argv into the schema's struct, then calls `validate` for
// cross-field checks. Prints errors, help and --print-config output itself.
CommandLineResult LoadDaemonConfig(
    int argc, char** argv, const std::string& daemon_name, ConfigSchema* schema,
    const std::function<absl::Status()>& validate);

// Writes {"grpc_address": ..., "metrics_address": ..., "pid": ...} to
// `path` atomically (temp file + rename).
absl::Status WriteReadyFile(const std::string& path,
                            const std::string& grpc_address,
                            const std::string& metrics_address);

}  // namespace tandem::config
