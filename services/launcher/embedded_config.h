#pragma once

// The embedded default configuration of each daemon as run by tandem-local:
// YAML text layered over the daemons' own defaults.

#include <string>

namespace tandem::launcher {

// `daemon` is coordinator, trainer, verifier or rollout.
std::string EmbeddedConfig(const std::string& daemon);

// The tasks tandem-local runs: "arith" (the default: 3-digit addition) and
// "tools" (products with the calculator environment, common/task/
// tools_task.h).
bool IsLauncherTask(const std::string& task);

// The embedded configuration of `daemon` for `task`; "arith" is
// EmbeddedConfig(daemon). For "tools" the launcher adds what only a run
// knows: the coordinator's dataset.path (the JSONL it writes) and
// dataset.tokenizer (the warm start's), and the workers'
// environment.address (the verifier's gRPC address).
std::string EmbeddedConfig(const std::string& daemon, const std::string& task);

}  // namespace tandem::launcher
