#include "services/verifier/environment/environment_metrics.h"

#include "absl/strings/str_cat.h"
#include "common/environment/episode_end_reason.h"

namespace tandem::verifier {

EnvironmentMetrics::EnvironmentMetrics(prometheus::Registry& registry)
    : open_(prometheus::BuildGauge()
                .Name("tandem_verifier_env_episodes_open")
                .Help("Episodes held: open, or ended and not yet closed or "
                      "reaped.")
                .Register(registry)
                .Add({})),
      opened_(prometheus::BuildCounter()
                  .Name("tandem_verifier_env_episodes_opened_total")
                  .Help("Episodes opened, by environment.")
                  .Register(registry)),
      ended_(prometheus::BuildCounter()
                 .Name("tandem_verifier_env_episodes_ended_total")
                 .Help(absl::StrCat("Episodes ended, by reason: ",
                                    environment::EndReasonLabelList(),
                                    ", closed (by the client before the "
                                    "end), idle (reaped)."))
                 .Register(registry)),
      tool_calls_(prometheus::BuildCounter()
                      .Name("tandem_verifier_env_tool_calls_total")
                      .Help("Tool calls, by tool and outcome: ok, "
                            "bad_arguments, tool_error, unknown_tool.")
                      .Register(registry)),
      refused_(prometheus::BuildCounter()
                   .Name("tandem_verifier_env_open_refused_total")
                   .Help("OpenEpisode calls refused because "
                         "environment.max_open_episodes episodes were held.")
                   .Register(registry)
                   .Add({})) {
  // The closed label sets, exported at 0 from the start.
  for (const environment::EndReasonEntry& entry :
       environment::kEndReasonTable) {
    ended_.Add({{"reason", std::string(entry.label)}});
  }
  for (absl::string_view reason : {kEndReasonClosed, kEndReasonIdle}) {
    ended_.Add({{"reason", std::string(reason)}});
  }
  for (const char* environment : {"calculator", "single_turn"}) {
    opened_.Add({{"environment", environment}});
  }
  for (absl::string_view outcome : {kToolOk, kToolBadArguments, kToolError}) {
    tool_calls_.Add(
        {{"tool", "calculator"}, {"outcome", std::string(outcome)}});
  }
  tool_calls_.Add(
      {{"tool", "unknown"}, {"outcome", std::string(kToolUnknown)}});
}

void EnvironmentMetrics::CountOpened(const std::string& environment) {
  opened_.Add({{"environment", environment}}).Increment();
}

void EnvironmentMetrics::CountEnded(absl::string_view reason) {
  ended_.Add({{"reason", std::string(reason)}}).Increment();
}

void EnvironmentMetrics::CountToolCall(absl::string_view tool,
                                       absl::string_view outcome) {
  tool_calls_
      .Add({{"tool", std::string(tool)}, {"outcome", std::string(outcome)}})
      .Increment();
}

void EnvironmentMetrics::CountRefused() { refused_.Increment(); }

}  // namespace tandem::verifier
