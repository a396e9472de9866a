#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::rollout {

struct RolloutConfig {
  config::ServerOptions server;
  std::string coordinator_address = "127.0.0.1:50051";
  // Engine limits (used by the engine; advertised to the coordinator).
  int64_t max_num_seqs = 64;
  int64_t max_batched_tokens = 4096;
};

void RegisterFields(config::ConfigSchema* schema, RolloutConfig* config);
absl::Status Validate(const RolloutConfig& config);

}  // namespace tandem::rollout
