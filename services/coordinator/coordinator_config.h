#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::coordinator {

struct CoordinatorConfig {
  config::ServerOptions server;
  // Members heartbeat this often.
  int64_t heartbeat_interval_ms = 1000;
  // A member silent this long is declared dead and its leases reclaimed.
  int64_t heartbeat_timeout_ms = 5000;
  // Dead and departed members stay visible in status this long.
  int64_t member_retention_ms = 300000;
  // Samples per prompt.
  int64_t group_size = 8;
  // Staleness bound in policy versions.
  int64_t max_lag = 4;
};

void RegisterFields(config::ConfigSchema* schema, CoordinatorConfig* config);
absl::Status Validate(const CoordinatorConfig& config);

}  // namespace tandem::coordinator
