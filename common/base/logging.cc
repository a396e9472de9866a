#include "common/base/logging.h"

#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace tandem {
namespace {

std::mutex g_mu;
LogOptions g_options;  // guarded by g_mu

// %j: the message as the body of a JSON string (quotes, backslashes and
// control characters escaped), so every JSON log line parses whatever the
// message holds.
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : msg.payload) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(c);
      } else if (u < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 15]};
        dest.append(esc, esc + sizeof(esc));
      } else {
        dest.push_back(c);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

constexpr char kJsonPattern[] =
    R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","component":"%n","pid":%P,"msg":"%j"})";
constexpr char kTextPattern[] = "%Y-%m-%d %H:%M:%S.%e %L [%n] %v";

std::unique_ptr<spdlog::formatter> MakeFormatter(LogFormat format) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>(
      spdlog::pattern_time_type::utc);
  formatter->add_flag<JsonEscapedMessage>('j');
  formatter->set_pattern(format == LogFormat::kJson ? kJsonPattern
                                                    : kTextPattern);
  return formatter;
}

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
  spdlog::set_formatter(MakeFormatter(options.format));
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
  logger->set_formatter(MakeFormatter(g_options.format));
  logger->flush_on(spdlog::level::info);
  spdlog::register_logger(logger);
  return logger;
}

}  // namespace tandem
