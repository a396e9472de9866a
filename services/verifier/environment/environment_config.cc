#include "services/verifier/environment/environment_config.h"

namespace tandem::verifier {

void RegisterEnvironmentFields(config::ConfigSchema* schema,
                               EnvironmentConfig* config) {
  schema->AddInt("environment.max_turns", &config->max_turns, 1, 1000,
                 "Model turns per episode; the turn that reaches it without "
                 "an answer ends the episode (reason max_turns).");
  schema->AddInt("environment.max_observation_bytes",
                 &config->max_observation_bytes, 64, int64_t{1} << 26,
                 "Bytes of observations one step may return; more ends the "
                 "episode (reason observation_too_large).");
  schema->AddInt("environment.episode_timeout_ms", &config->episode_timeout_ms,
                 10, int64_t{24} * 3600 * 1000,
                 "Life of an episode from OpenEpisode; a step after it ends "
                 "the episode (reason timeout).");
  schema->AddInt("environment.max_open_episodes", &config->max_open_episodes, 1,
                 10000000,
                 "Episodes held at once (open, or ended and not closed); "
                 "OpenEpisode past it gets RESOURCE_EXHAUSTED.");
  schema->AddInt("environment.idle_timeout_ms", &config->idle_timeout_ms, 10,
                 int64_t{24} * 3600 * 1000,
                 "An episode without a call for this long is reaped; its id "
                 "then answers NOT_FOUND.");
  schema->AddInt("environment.max_action_bytes", &config->max_action_bytes, 64,
                 int64_t{1} << 26,
                 "Bytes of one Step's action (text and tool calls); more is "
                 "INVALID_ARGUMENT.");
  schema->AddInt("environment.max_tool_calls", &config->max_tool_calls, 1, 1024,
                 "Tool calls in one action; more is INVALID_ARGUMENT.");
}

}  // namespace tandem::verifier
