#pragma once

// Limits of the episodes the verifier's environment service hosts
// (config keys environment.*; docs/environments.md).

#include <cstdint>

#include "common/config/config_schema.h"

namespace tandem::verifier {

struct EnvironmentConfig {
  // Steps (model turns) per episode; the turn that reaches it without an
  // answer ends the episode (EPISODE_END_MAX_TURNS).
  int64_t max_turns = 8;
  // Bytes of observation content one step may return; more ends the
  // episode (EPISODE_END_OBSERVATION_TOO_LARGE) instead of feeding it to
  // the model.
  int64_t max_observation_bytes = 16384;
  // Wall-clock life of an episode from OpenEpisode; a Step after it ends
  // the episode (EPISODE_END_TIMEOUT).
  int64_t episode_timeout_ms = 600000;
  // Episodes held at once (open, or ended and not closed); OpenEpisode past
  // it gets RESOURCE_EXHAUSTED.
  int64_t max_open_episodes = 1024;
  // An episode without a call for this long is reaped (freed; its id then
  // answers NOT_FOUND).
  int64_t idle_timeout_ms = 120000;
  // Bytes of one Step's action (text plus tool calls); more is
  // INVALID_ARGUMENT.
  int64_t max_action_bytes = 262144;
  // Tool calls in one action; more is INVALID_ARGUMENT.
  int64_t max_tool_calls = 16;
};

void RegisterEnvironmentFields(config::ConfigSchema* schema,
                               EnvironmentConfig* config);

}  // namespace tandem::verifier
