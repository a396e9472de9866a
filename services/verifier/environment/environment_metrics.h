#pragma once

// Metric families of the environment service (hosted by the verifier, in
// its registry). Labels are closed sets: environment (the built-in names),
// end reason (the EpisodeEndReason labels of
// common/environment/episode_end_reason.h plus kEndReasonClosed and
// kEndReasonIdle), tool (the built-in tools plus "unknown") and tool
// outcome (kToolOutcomes).

#include <string>

#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem::verifier {

// Episode end reasons that are not EpisodeEndReason values: closed by its
// client before it ended, and reaped after environment.idle_timeout_ms
// without a call.
inline constexpr absl::string_view kEndReasonClosed = "closed";
inline constexpr absl::string_view kEndReasonIdle = "idle";

// A tool call's outcome: ran and answered ("ok"); its arguments were not a
// JSON object with the tool's parameters ("bad_arguments"); the tool
// refused the input (e.g. division by zero: "tool_error"); no such tool
// ("unknown_tool").
inline constexpr absl::string_view kToolOk = "ok";
inline constexpr absl::string_view kToolBadArguments = "bad_arguments";
inline constexpr absl::string_view kToolError = "tool_error";
inline constexpr absl::string_view kToolUnknown = "unknown_tool";

class EnvironmentMetrics {
 public:
  explicit EnvironmentMetrics(prometheus::Registry& registry);
  // Episodes held (open, or ended and not yet closed or reaped).
  prometheus::Gauge& open() { return open_; }
  void CountOpened(const std::string& environment);
  void CountEnded(absl::string_view reason);
  void CountToolCall(absl::string_view tool, absl::string_view outcome);
  // OpenEpisode refused for max_open_episodes.
  void CountRefused();

 private:
  prometheus::Gauge& open_;
  prometheus::Family<prometheus::Counter>& opened_;
  prometheus::Family<prometheus::Counter>& ended_;
  prometheus::Family<prometheus::Counter>& tool_calls_;
  prometheus::Counter& refused_;
};

}  // namespace tandem::verifier
