#pragma once

// The embedded default configuration of each daemon as run by tandem-local:
// YAML text layered over the daemons' own defaults.

#include <string>

namespace tandem::launcher {

// `daemon` is coordinator, trainer, verifier or rollout.
std::string EmbeddedConfig(const std::string& daemon);

}  // namespace tandem::launcher
