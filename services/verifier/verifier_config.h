#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::verifier {

struct VerifierConfig {
  config::ServerOptions server;
  std::string coordinator_address = "127.0.0.1:50051";
  // Items scored at the same time; batches beyond it get RESOURCE_EXHAUSTED.
  int64_t max_concurrency = 64;
  // Threads that run scorers.
  int64_t worker_threads = 2;
  // Verifier names this replica serves and advertises to the coordinator,
  // which routes samples by them; empty = every registered verifier.
  std::vector<std::string> verifiers;
  // Sandbox limits for the `code` verifier.
  int64_t code_cpu_seconds = 5;
  double code_wall_seconds = 10.0;
  int64_t code_address_space_bytes = int64_t{1} << 30;
  int64_t code_max_output_bytes = int64_t{1} << 20;
  int64_t code_max_processes = 64;
  bool code_allow_network_fallback = false;
  // A private, read-only filesystem view per run (mount namespace) where
  // the kernel allows it.
  bool code_private_filesystem = true;
};

void RegisterFields(config::ConfigSchema* schema, VerifierConfig* config);
absl::Status Validate(const VerifierConfig& config);

}  // namespace tandem::verifier
