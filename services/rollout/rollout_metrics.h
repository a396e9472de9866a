#pragma once

// Metric families of the rollout worker, declared once. The engine returns
// plain StepStats; RolloutMetrics::Record turns them into metrics.

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/rollout/harness_episodes.h"

namespace tandem::rollout {

struct RolloutMetrics {
  explicit RolloutMetrics(prometheus::Registry& registry);
  void RecordStep(const engine::StepStats& step,
                  const engine::EngineSnapshot& snapshot);
  void RecordFinished(const engine::FinishedSample& sample);
  // One finished episode: its end reason (a label of kEpisodeEndReasons),
  // tool calls and malformed turns.
  void RecordEpisode(const std::string& end_reason, int32_t tool_calls,
                     int32_t malformed_turns);
  // Harness episodes held by state, and the turns since the last call.
  void RecordHarness(const HarnessCounts& counts);

  prometheus::Gauge& policy_version;
  prometheus::Gauge& paused;
  prometheus::Counter& generated_tokens;
  prometheus::Counter& prefill_tokens;
  prometheus::Family<prometheus::Counter>& finished;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Gauge& parked;
  prometheus::Gauge& kv_usage;
  prometheus::Counter& preemptions;
  prometheus::Histogram& batch_size;
  prometheus::Histogram& step_seconds;
  prometheus::Histogram& time_per_output_token;
  prometheus::Histogram& pause_seconds;
  prometheus::Histogram& version_spread;
  // Samples the coordinator refused (each sent alone after their batch was
  // refused) and that were dropped.
  prometheus::Counter& samples_refused;
  // Pause, Resume and Drain calls refused by mutual-TLS authorization, by
  // reason: unauthenticated, wrong_role.
  prometheus::Family<prometheus::Counter>& auth_refused;
  // Multi-turn episodes (docs/environments.md).
  prometheus::Family<prometheus::Counter>& episodes_ended;
  prometheus::Counter& episode_tool_calls;
  prometheus::Counter& episode_malformed_turns;
  // The engine had nothing to run while episodes waited for their
  // environment: how often, and for how long (the share of the worker's
  // time lost to environments; docs/environments.md, "Throughput").
  prometheus::Counter& environment_idle_waits;
  prometheus::Counter& environment_idle_seconds;
  // Harness-driven episodes (docs/openai-endpoint.md, "Training a
  // black-box agent").
  prometheus::Family<prometheus::Gauge>& harness_episodes;
  prometheus::Family<prometheus::Counter>& harness_turns;
  prometheus::Family<prometheus::Counter>& harness_leases_returned;
};

}  // namespace tandem::rollout
