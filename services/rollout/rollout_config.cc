#include "services/rollout/rollout_config.h"

#include "common/cluster/member_daemon.h"

namespace tandem::rollout {

void RegisterFields(config::ConfigSchema* schema, RolloutConfig* config) {
  config::AddServerOptions(schema, &config->server);
  cluster::AddCoordinatorAddress(schema, &config->coordinator_address);
  schema->AddInt("engine.max_num_seqs", &config->max_num_seqs, 1, 65536,
                 "Most sequences decoded together in one batch.");
  schema->AddInt("engine.max_batched_tokens", &config->max_batched_tokens, 1,
                 1 << 24, "Most tokens processed in one engine step.");
}

absl::Status Validate(const RolloutConfig& config) { return absl::OkStatus(); }

}  // namespace tandem::rollout
