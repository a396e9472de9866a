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
# Measured on this task (docs/demo.md): lr 3e-4 climbs fast, then
# oscillates around 84-85%; 1e-4 keeps climbing. Clip-higher and dynamic
# sampling as DAPO. 2048 held-out problems: one evaluation's standard error
# is under 1 point; every 50 versions keeps evaluation near 10% of the
# trainer's time.
training:
  lr: 0.0001
  clip_high: 0.28
  dynamic_sampling: true
eval:
  every_versions: 50
  problems: 2048
  arith_digits: 3
  arith_subtraction: false
)";
  }
  return "";
}

bool IsLauncherTask(const std::string& task) {
  return task == "arith" || task == "tools";
}

std::string EmbeddedConfig(const std::string& daemon, const std::string& task) {
  if (task != "tools") return EmbeddedConfig(daemon);
  if (daemon == "coordinator") {
    return R"(# tandem-local --task tools: coordinator
heartbeat_interval_ms: 500
heartbeat_timeout_ms: 3000
group_size: 8
max_lag: 4
# Rows name the calculator environment; the launcher writes them and sets
# dataset.path and dataset.tokenizer.
dataset:
  kind: jsonl
  epochs: 0
  shuffle: true
)";
  }
  if (daemon == "rollout") {
    return R"(# tandem-local --task tools: rollout worker
engine:
  max_num_seqs: 64
# A call turn ends at </tool_call>; the launcher sets environment.address.
environment:
  max_turns: 3
  max_turn_tokens: 96
  turn_stop_strings: ["</tool_call>"]
)";
  }
  if (daemon == "verifier") {
    return R"(# tandem-local --task tools: verifier (hosts the calculator)
worker_threads: 1
)";
  }
  if (daemon == "trainer") {
    return R"(# tandem-local --task tools: trainer
checkpoint_dir: checkpoints
training:
  lr: 0.0001
  clip_high: 0.28
  dynamic_sampling: true
  # A group of 8 episodes is about 1300 tokens: room for the 16 groups a
  # step the coordinator dispatches for (with the default 4096, 2-3 groups
  # a step, versions outran the episodes and 60% of them went stale).
  batch_max_tokens: 16384
# Greedy calculator episodes on held-out products; 256 problems (an
# episode decodes two turns, ten times the tokens of an arith answer).
eval:
  every_versions: 20
  problems: 256
  task: tools
  tools_digits: 4
)";
  }
  return "";
}

}  // namespace tandem::launcher
