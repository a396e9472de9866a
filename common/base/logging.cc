#include "common/base/logging.h"

#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace tandem {
namespace {

std::mutex g_mu;
LogOptions g_options;  // guarded by g_mu

// JSON-lines pattern: the message is escaped by spdlog's %v only for plain
// text, so components must not log raw quotes in JSON mode; messages that
// contain them are still one line and parseable by lenient shippers.
constexpr char kJsonPattern[] =
    R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","component":"%n","pid":%P,"msg":"%v"})";
constexpr char kTextPattern[] = "%Y-%m-%d %H:%M:%S.%e %L [%n] %v";

}  // namespace

absl::Status ParseLogFormat(absl::string_view text, LogFormat* out) {
  if (text == "text") {
    *out = LogFormat::kText;
  } else if (text == "json") {
    *out = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("log format must be text or json, got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::Status InitLogging(const LogOptions& options) {
  auto level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("log level must be one of trace, debug, info, warn, "
                     "error, critical, off; got '",
                     options.level, "'"));
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_options = options;
  spdlog::set_level(level);
  spdlog::set_pattern(
      options.format == LogFormat::kJson ? kJsonPattern : kTextPattern,
      spdlog::pattern_time_type::utc);
  spdlog::flush_on(spdlog::level::info);
  return absl::OkStatus();
}

std::shared_ptr<spdlog::logger> ComponentLogger(std::string_view component) {
  std::string name(component);
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(name, sink);
  logger->set_level(spdlog::get_level());
  logger->set_pattern(
      g_options.format == LogFormat::kJson ? kJsonPattern : kTextPattern,
      spdlog::pattern_time_type::utc);
  logger->flush_on(spdlog::level::info);
  spdlog::register_logger(logger);
  return logger;
}

}  // namespace tandem
