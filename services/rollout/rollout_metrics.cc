#include "services/rollout/rollout_metrics.h"

#include "absl/strings/str_cat.h"
#include "common/environment/episode_end_reason.h"

namespace tandem::rollout {
namespace {

prometheus::Gauge& Gauge(prometheus::Registry& r, const char* name,
                         const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter& Counter(prometheus::Registry& r, const char* name,
                             const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram& Histogram(prometheus::Registry& r, const char* name,
                                 const char* help,
                                 prometheus::Histogram::BucketBoundaries b) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(
      {}, std::move(b));
}

}  // namespace

RolloutMetrics::RolloutMetrics(prometheus::Registry& r)
    : policy_version(Gauge(r, "tandem_policy_version",
                           "Policy version of the live weights.")),
      paused(Gauge(r, "tandem_rollout_paused",
                   "1 while generation is paused or drained, else 0.")),
      generated_tokens(Counter(r, "tandem_rollout_generated_tokens_total",
                               "Tokens sampled.")),
      prefill_tokens(Counter(r, "tandem_rollout_prefill_tokens_total",
                             "Prompt (and recomputed) tokens computed.")),
      finished(prometheus::BuildCounter()
                   .Name("tandem_rollout_samples_finished_total")
                   .Help("Finished samples by finish reason.")
                   .Register(r)),
      running(Gauge(r, "tandem_rollout_running_sequences",
                    "Sequences in the running batch.")),
      waiting(Gauge(r, "tandem_rollout_waiting_sequences",
                    "Sequences waiting for KV-cache space.")),
      parked(Gauge(r, "tandem_rollout_parked_sequences",
                   "Episode sequences parked at a turn end, waiting for "
                   "their environment (no batch slot; they keep their KV "
                   "cache).")),
      kv_usage(Gauge(r, "tandem_rollout_kv_cache_usage_ratio",
                     "Fraction of KV-cache blocks in use.")),
      preemptions(Counter(r, "tandem_rollout_preemptions_total",
                          "Sequences preempted for KV-cache space.")),
      batch_size(Histogram(r, "tandem_rollout_batch_size",
                           "Sequences sampling a token per engine step.",
                           {1, 2, 4, 8, 16, 32, 64, 128, 256})),
      step_seconds(Histogram(
          r, "tandem_rollout_step_seconds", "Duration of one engine step.",
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1})),
      time_per_output_token(Histogram(
          r, "tandem_rollout_time_per_output_token_seconds",
          "Wall time per generated token of a finished sample.",
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1})),
      pause_seconds(
          Histogram(r, "tandem_rollout_weight_update_pause_seconds",
                    "Generation pause to commit a new weight version.",
                    {0.00001, 0.0001, 0.001, 0.01, 0.1, 1, 10})),
      version_spread(Histogram(
          r, "tandem_rollout_sample_version_spread",
          "Policy versions spanned by one finished sample (max - min).",
          {0, 1, 2, 3, 4, 8, 16})),
      samples_refused(Counter(
          r, "tandem_rollout_samples_refused_total",
          "Finished samples the coordinator refused as invalid (sent alone "
          "after the call holding them was refused) and dropped; the other "
          "samples of that call were delivered.")),
      auth_refused(prometheus::BuildCounter()
                       .Name("tandem_rollout_auth_refused_total")
                       .Help("Pause, Resume and Drain calls refused by "
                             "mutual-TLS authorization (they need the admin "
                             "role), by reason: unauthenticated, wrong_role. "
                             "Always 0 with tls.mode off.")
                       .Register(r)),
      episodes_ended(
          prometheus::BuildCounter()
              .Name("tandem_rollout_episodes_ended_total")
              .Help(absl::StrCat(
                  "Multi-turn episodes finished, by end reason: the "
                  "environment's (",
                  environment::EndReasonLabelList(),
                  ") or the worker's (turn_limit, token_limit, "
                  "environment_failed, aborted; aborted ones are not "
                  "delivered)."))
              .Register(r)),
      episode_tool_calls(Counter(
          r, "tandem_rollout_episode_tool_calls_total",
          "Tool calls parsed from the model's turns in finished episodes.")),
      episode_malformed_turns(Counter(
          r, "tandem_rollout_episode_malformed_turns_total",
          "Model turns of finished episodes whose tool call did not parse "
          "(sent to the environment as text).")),
      environment_idle_waits(Counter(
          r, "tandem_rollout_environment_idle_waits_total",
          "Times the engine had no sequence to run while episodes waited "
          "for their environment's reply (each wait is at most 5 ms).")),
      environment_idle_seconds(Counter(
          r, "tandem_rollout_environment_idle_seconds_total",
          "Seconds the engine had no sequence to run while episodes waited "
          "for their environment's reply.")),
      harness_episodes(
          prometheus::BuildGauge()
              .Name("tandem_rollout_harness_episodes")
              .Help("Harness-driven episodes held by this worker, by state: "
                    "unclaimed (offered, no harness took it yet), claimed "
                    "(a harness drives it), finished (waiting for the rest "
                    "of its group).")
              .Register(r)),
      harness_turns(
          prometheus::BuildCounter()
              .Name("tandem_rollout_harness_turns_total")
              .Help("Model turns of harness episodes, by outcome: accepted, "
                    "or refused (unknown or ended episode, a turn already "
                    "in flight, a prompt that does not extend the "
                    "episode's tokens, another temperature).")
              .Register(r)),
      harness_leases_returned(
          prometheus::BuildCounter()
              .Name("tandem_rollout_harness_leases_returned_total")
              .Help("Leases of harness episodes given back to the "
                    "coordinator, by reason: aborted (by a harness), "
                    "idle_timeout (openai.harness_idle_timeout_s), lifetime "
                    "(openai.harness_max_episode_s).")
              .Register(r)) {
  for (const environment::EndReasonEntry& entry :
       environment::kEndReasonTable) {
    episodes_ended.Add({{"reason", std::string(entry.label)}});
  }
  for (const char* reason :
       {"turn_limit", "token_limit", "environment_failed", "aborted"}) {
    episodes_ended.Add({{"reason", reason}});
  }
  for (const char* reason : {"stop", "length", "aborted"}) {
    finished.Add({{"reason", reason}});
  }
  for (const char* reason : {"unauthenticated", "wrong_role"}) {
    auth_refused.Add({{"reason", reason}});
  }
  for (const char* state : {"unclaimed", "claimed", "finished"}) {
    harness_episodes.Add({{"state", state}});
  }
  for (const char* outcome : {"accepted", "refused"}) {
    harness_turns.Add({{"outcome", outcome}});
  }
  for (HarnessReturn why : kHarnessReturns) {
    harness_leases_returned.Add({{"reason", HarnessReturnLabel(why)}});
  }
}

void RolloutMetrics::RecordStep(const engine::StepStats& step,
                                const engine::EngineSnapshot& snapshot) {
  generated_tokens.Increment(step.decode_tokens);
  prefill_tokens.Increment(step.prefill_tokens);
  preemptions.Increment(step.preempted);
  if (step.decode_tokens > 0) batch_size.Observe(step.decode_tokens);
  if (step.decode_tokens + step.prefill_tokens > 0) {
    step_seconds.Observe(step.step_seconds);
  }
  if (step.committed_update) pause_seconds.Observe(step.pause_seconds);
  running.Set(snapshot.running);
  waiting.Set(snapshot.waiting);
  parked.Set(snapshot.parked);
  kv_usage.Set(snapshot.kv_blocks_total == 0
                   ? 0.0
                   : static_cast<double>(snapshot.kv_blocks_used) /
                         snapshot.kv_blocks_total);
  policy_version.Set(static_cast<double>(snapshot.policy_version));
}

void RolloutMetrics::RecordHarness(const HarnessCounts& counts) {
  harness_episodes.Add({{"state", "unclaimed"}}).Set(counts.unclaimed);
  harness_episodes.Add({{"state", "claimed"}}).Set(counts.claimed);
  harness_episodes.Add({{"state", "finished"}}).Set(counts.finished);
  harness_turns.Add({{"outcome", "accepted"}})
      .Increment(static_cast<double>(counts.turns_accepted));
  harness_turns.Add({{"outcome", "refused"}})
      .Increment(static_cast<double>(counts.turns_refused));
}

void RolloutMetrics::RecordEpisode(const std::string& end_reason,
                                   int32_t tool_calls,
                                   int32_t malformed_turns) {
  episodes_ended.Add({{"reason", end_reason}}).Increment();
  episode_tool_calls.Increment(tool_calls);
  episode_malformed_turns.Increment(malformed_turns);
}

void RolloutMetrics::RecordFinished(const engine::FinishedSample& sample) {
  finished.Add({{"reason", engine::FinishReasonName(sample.finish_reason)}})
      .Increment();
  if (!sample.output.empty()) {
    time_per_output_token.Observe(
        absl::ToDoubleSeconds(sample.finished - sample.admitted) /
        sample.output.size());
  }
  if (!sample.spans.empty()) {
    uint64_t lo = sample.spans.front().policy_version, hi = lo;
    for (const auto& s : sample.spans) {
      lo = std::min(lo, s.policy_version);
      hi = std::max(hi, s.policy_version);
    }
    version_spread.Observe(static_cast<double>(hi - lo));
  }
}

}  // namespace tandem::rollout
