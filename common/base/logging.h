#pragma once

// Logging for all daemons: one spdlog logger per component, written to
// stderr either as human-readable lines or as JSON lines (one object per
// line with time, level, component and message) for log shippers.

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace tandem {

enum class LogFormat { kText, kJson };

struct LogOptions {
  std::string level = "info";  // trace|debug|info|warn|error|critical|off
  LogFormat format = LogFormat::kText;
};

// Configures the process-wide sinks. Call once from main() before any
// component logger is created. Returns InvalidArgument for an unknown level.
absl::Status InitLogging(const LogOptions& options);

// Returns the logger for `component` (e.g. "coordinator"), creating it with
// the configured sinks on first use. Thread-safe.
std::shared_ptr<spdlog::logger> ComponentLogger(std::string_view component);

// Parses "text"/"json".
absl::Status ParseLogFormat(absl::string_view text, LogFormat* out);

}  // namespace tandem
