#pragma once

// TlsOptions: how one process secures its gRPC servers and clients. A plain
// struct without gRPC includes, so that config structs (config::ServerOptions,
// tandemctl, the launcher) can hold it; common/rpc/tls_credentials.h turns it
// into gRPC credentials.
//
// One certificate serves both directions: a daemon presents `cert` to the
// clients that call it and to the servers it calls. `tandemctl certs init`
// writes certificates usable for both (extendedKeyUsage serverAuth and
// clientAuth).

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tandem::rpc {

struct TlsOptions {
  // "off": plaintext. "mtls": TLS both ways; every peer must present a
  // certificate that chains to `ca`.
  std::string mode = "off";
  // PEM certificate chain of this process, leaf first.
  std::string cert;
  // PEM private key of `cert`.
  std::string key;
  // PEM bundle of the CA certificates peers' certificates must chain to.
  std::string ca;
  // The name a client checks the server's certificate (its DNS or IP SANs)
  // against; empty = the host part of the address it dials.
  std::string server_name;
  // How often the three files are re-read, in seconds: a certificate
  // replaced on disk is used by new connections within this time.
  int64_t refresh_s = 60;

  bool enabled() const { return mode == "mtls"; }
};

// Which of the three PEM files a check is about.
enum class TlsFile { kCert, kKey, kCa };

// Checks one file: it is readable and holds what `kind` needs (at least one
// certificate for kCert and kCa, a private key for kKey). The message names
// the file and the problem, not the config key ("cannot read '/x.pem': No
// such file or directory").
absl::Status CheckTlsFile(TlsFile kind, const std::string& path);

// True if the private key in `key_path` belongs to the first certificate in
// `cert_path`; an error if either cannot be read or parsed.
absl::Status CheckKeyMatchesCert(const std::string& key_path,
                                 const std::string& cert_path);

// Every check of `options` at once (for callers without a config schema):
// mode is off or mtls; with mtls, cert, key and ca are set, readable and
// parse, and the key matches the certificate. Messages start with the field
// ("tls.cert: ...").
absl::Status CheckTlsOptions(const TlsOptions& options);

// True if `host` (no port) is a loopback address or "localhost": a server
// bound there is reachable only from this machine.
bool IsLoopbackHost(const std::string& host);

}  // namespace tandem::rpc
