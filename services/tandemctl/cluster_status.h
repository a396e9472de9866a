#pragma once

// Rendering of the coordinator's cluster status for terminals and scripts,
// shared by `tandemctl status` and the local launcher.

#include <string>

#include "tandem/v1/coordinator.pb.h"

namespace tandem::ctl {

// A human-readable table: one line per member, then queue depths.
std::string FormatClusterStatus(
    const tandem::v1::GetClusterStatusResponse& status, int64_t now_unix_ms);

// One-line summary: "members 5/5 alive · version 3 · 1234 tok/s · ...".
std::string FormatStatusLine(
    const tandem::v1::GetClusterStatusResponse& status);

}  // namespace tandem::ctl
