#pragma once

// TLS settings of a command-line client (tandemctl, tandem-local): the flags
// --tls-mode, --tls-cert, --tls-key, --tls-ca, --tls-server-name and
// --tls-refresh-s, layered over the same TANDEM_TLS_* environment variables
// a daemon's tls section reads, and checked the same way (a missing or
// unreadable file names its flag and value). Giving --tls-cert, --tls-key
// or --tls-ca without --tls-mode means --tls-mode mtls.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/tls_options.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tandem::config {

class TlsFlags {
 public:
  // Adds the flags to `app` (call once per subcommand that dials).
  void AddTo(CLI::App* app);
  // The environment, then the flags given; checked.
  absl::StatusOr<rpc::TlsOptions> Resolve() const;

 private:
  // tls.* key -> flag value; empty when the flag was not given.
  std::map<std::string, std::string> values_;
};

}  // namespace tandem::config
