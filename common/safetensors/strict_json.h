#pragma once

// JSON parsing for the safetensors header and the sharded-checkpoint index.
// Internal to common/safetensors.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::safetensors::internal {

// Deepest nesting of arrays and objects accepted. Safetensors headers and
// indexes nest three levels; the bound keeps recursive code such as
// json::dump() safe on hostile input.
inline constexpr size_t kMaxNestingDepth = 64;

// Words the error for a key repeated in one object. `path` lists the keys
// leading to that object from the root ("[]" for an array element; empty
// for the root object itself).
using DuplicateKeyMessage = std::function<std::string(
    const std::vector<std::string>& path, const std::string& key)>;

// Parses `text` as one JSON value (surrounding whitespace allowed). Unlike
// nlohmann::json::parse, which silently keeps the last of repeated keys,
// a key repeated within one object is an error, and so is a NUL byte
// (which nlohmann would take for the end of the input). Never throws.
//
// Errors are InvalidArgument and start with `source` (usually a path):
//   "<source>: <what> is not valid JSON: <parser detail with byte offset>"
//   "<source>: <what> has nesting deeper than 64 levels"
//   "<source>: <duplicate_message(path, key)>"
absl::StatusOr<nlohmann::json> ParseJsonRejectingDuplicateKeys(
    absl::string_view text, absl::string_view source, absl::string_view what,
    const DuplicateKeyMessage& duplicate_message);

}  // namespace tandem::safetensors::internal
