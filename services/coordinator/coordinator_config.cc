#include "services/coordinator/coordinator_config.h"

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

void RegisterFields(config::ConfigSchema* schema, CoordinatorConfig* config) {
  config->server.grpc_address = "127.0.0.1:50051";
  config::AddServerOptions(schema, &config->server);
  schema->AddInt("heartbeat_interval_ms", &config->heartbeat_interval_ms, 10,
                 600000, "How often members heartbeat, in milliseconds.");
  schema->AddInt("heartbeat_timeout_ms", &config->heartbeat_timeout_ms, 20,
                 3600000,
                 "A member silent this long (ms) is declared dead and its "
                 "leases return to the queue.");
  schema->AddInt("member_retention_ms", &config->member_retention_ms, 0,
                 86400000,
                 "Dead and departed members stay visible in status this "
                 "long (ms).");
  schema->AddInt("group_size", &config->group_size, 1, 1024,
                 "Samples generated per prompt (GRPO group size).");
  schema->AddInt("max_lag", &config->max_lag, 0, 1000,
                 "Staleness bound: the most policy versions a trained token "
                 "may lag behind the trainer.");
}

absl::Status Validate(const CoordinatorConfig& config) {
  if (config.heartbeat_timeout_ms < 2 * config.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout_ms must be at least twice heartbeat_interval_ms (",
        config.heartbeat_interval_ms, "), got ", config.heartbeat_timeout_ms));
  }
  return absl::OkStatus();
}

}  // namespace tandem::coordinator
