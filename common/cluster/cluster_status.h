#pragma once

// Rendering of the coordinator's cluster status for terminals and scripts,
// shared by `tandemctl status` and the local launcher.

#include <string>

#include "tandem/v1/coordinator.pb.h"

namespace tandem::cluster {

// A human-readable table: one line per member, then queue depths.
std::string FormatClusterStatus(
    const tandem::v1::GetClusterStatusResponse& status, int64_t now_unix_ms);

}  // namespace tandem::cluster
