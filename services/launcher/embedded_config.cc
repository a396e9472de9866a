#include "services/launcher/embedded_config.h"

namespace tandem::launcher {

std::string EmbeddedConfig(const std::string& daemon) {
  if (daemon == "coordinator") {
    return R"(# tandem-local default: coordinator
heartbeat_interval_ms: 500
heartbeat_timeout_ms: 3000
group_size: 8
max_lag: 4
dataset:
  kind: builtin_arith
  arith_digits: 3
  arith_subtraction: false
)";
  }
  if (daemon == "rollout") {
    return R"(# tandem-local default: rollout worker
engine:
  max_num_seqs: 64
)";
  }
  if (daemon == "verifier") {
    return R"(# tandem-local default: verifier
worker_threads: 1
)";
  }
  if (daemon == "trainer") {
    return R"(# tandem-local default: trainer
checkpoint_dir: checkpoints
training:
  lr: 0.0003
eval:
  every_versions: 20
  problems: 256
  arith_digits: 3
  arith_subtraction: false
)";
  }
  return "";
}

}  // namespace tandem::launcher
