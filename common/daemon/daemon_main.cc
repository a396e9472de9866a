#include "common/daemon/daemon_main.h"

#include "common/base/status_macros.h"

namespace tandem::daemon {

absl::Status InitDaemonLogging(const config::ServerOptions& options) {
  LogOptions log_options;
  log_options.level = options.log_level;
  RETURN_IF_ERROR(ParseLogFormat(options.log_format, &log_options.format));
  return InitLogging(log_options);
}

}  // namespace tandem::daemon
