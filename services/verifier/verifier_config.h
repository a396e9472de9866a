#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"
#include "services/verifier/environment/environment_config.h"

namespace tandem::verifier {

struct VerifierConfig {
  config::ServerOptions server;
  std::string coordinator_address = "127.0.0.1:50051";
  // Items admitted at once (being scored or waiting for a worker thread);
  // a batch that would take it past the limit gets RESOURCE_EXHAUSTED.
  int64_t max_concurrency = 64;
  // Items in one ScoreBatch call; a larger batch gets RESOURCE_EXHAUSTED
  // naming the limit. At most max_concurrency.
  int64_t max_batch_items = 64;
  // Items scored in parallel, one per thread (a code item runs its programs
  // one after the other on its thread). Batches share the threads round
  // robin, item by item.
  int64_t worker_threads = 2;
  // Deadline of one item from when a thread starts it: past it the running
  // program is killed and the item scores 0 (outcome timeout). A batch's
  // deadline is its caller's gRPC deadline: when it passes or the caller
  // cancels, the batch's running programs are killed, its waiting items
  // dropped, and the call ends. Below the coordinator's scoring.timeout_ms
  // (10 s), so that one item alone always fits in a call.
  int64_t item_timeout_ms = 8000;
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
  // Limits of the episodes of the Environment service (environment.*).
  EnvironmentConfig environment;
};

void RegisterFields(config::ConfigSchema* schema, VerifierConfig* config);
absl::Status Validate(const VerifierConfig& config);

}  // namespace tandem::verifier
