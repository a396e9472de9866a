#include "services/trainer/trainer_config.h"

#include "common/cluster/member_daemon.h"

namespace tandem::trainer {

void RegisterFields(config::ConfigSchema* schema, TrainerConfig* config) {
  config::AddServerOptions(schema, &config->server);
  cluster::AddCoordinatorAddress(schema, &config->coordinator_address);
  schema->AddString("checkpoint_dir", &config->checkpoint_dir,
                    "Directory where checkpoints are written.");
}

absl::Status Validate(const TrainerConfig& config) {
  if (config.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint_dir must not be empty");
  }
  return absl::OkStatus();
}

}  // namespace tandem::trainer
