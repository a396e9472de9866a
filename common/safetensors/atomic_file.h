#pragma once

// Crash-safe whole-file writes.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tandem::safetensors {

// Writes the concatenation of `pieces` to `path` so that readers see either
// the old file or the complete new one: the bytes go to `path + ".tmp"`,
// which is fsync'ed and then renamed over `path`; the directory is fsync'ed
// so the rename survives a crash. On failure the temporary file is removed
// and `path` is untouched. Readers that have the old file mapped keep
// seeing the old bytes. Not safe against concurrent writers of one path.
absl::Status WriteFileAtomically(
    const std::string& path,
    absl::Span<const absl::Span<const uint8_t>> pieces);

}  // namespace tandem::safetensors
