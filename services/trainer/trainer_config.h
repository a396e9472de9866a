#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::trainer {

struct TrainerConfig {
  config::ServerOptions server;
  std::string coordinator_address = "127.0.0.1:50051";
  // Where checkpoints are written.
  std::string checkpoint_dir = "checkpoints";
};

void RegisterFields(config::ConfigSchema* schema, TrainerConfig* config);
absl::Status Validate(const TrainerConfig& config);

}  // namespace tandem::trainer
