#pragma once

// `tandemctl certs init`: a development certificate authority and one key
// and certificate per Tandem role, for tls.mode mtls (docs/operations.md,
// TLS). Not a production PKI: the CA key sits next to the certificates.
//
//   D/ca.pem, D/ca.key              the CA (made unless it already exists)
//   D/<role>.pem, D/<role>.key      role in coordinator, trainer, rollout,
//                                   verifier, admin
//
// Each role certificate carries the SAN URI spiffe://tandem/<role>/<name>
// (what per-role authorization will read), DNS or IP SANs for every host
// given, and extendedKeyUsage serverAuth and clientAuth, since a daemon
// presents one certificate to its clients and to the servers it calls.
// Keys are EC P-256, written 0600. Files are replaced atomically (temp file
// and rename), so a running daemon's file watcher never reads half a file.

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tandem::certs {

struct CertsInitOptions {
  // Where the role certificates are written (created if missing).
  std::string dir;
  // The CA that signs them: its ca.pem and ca.key are reused when both
  // exist; empty = `dir` (a new CA is made there when it has none).
  std::string ca_dir;
  // Validity of the role certificates (the CA gets ten times as long).
  int days = 365;
  // DNS names or IP addresses every role certificate is valid for.
  std::vector<std::string> hosts = {"localhost", "127.0.0.1"};
  // The <name> of each SAN URI.
  std::string name = "dev";
};

// Writes the files (quietly). Errors name the file or the OpenSSL step.
absl::Status WriteDevCertificates(const CertsInitOptions& options);

// Registers --dir, --ca-dir, --days, --hosts and --name on `app`.
void AddCertsInitFlags(CLI::App* app, CertsInitOptions* options);

// Writes the files; prints what it wrote. Returns the exit code: 0, or 1
// after printing the error.
int RunCertsInit(const CertsInitOptions& options);

}  // namespace tandem::certs
