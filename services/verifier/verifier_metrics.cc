#include "services/verifier/verifier_metrics.h"

#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

VerifierMetrics::VerifierMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("tandem_verifier_requests_total")
                    .Help("Items scored, by verifier and outcome.")
                    .Register(registry)),
      seconds_(prometheus::BuildHistogram()
                   .Name("tandem_verifier_scoring_seconds")
                   .Help("Time to score one item, by verifier.")
                   .Register(registry)),
      inflight_(prometheus::BuildGauge()
                    .Name("tandem_verifier_inflight_items")
                    .Help("Items admitted and not finished: waiting for a "
                          "worker thread or being scored.")
                    .Register(registry)
                    .Add({})),
      running_(prometheus::BuildGauge()
                   .Name("tandem_verifier_running_items")
                   .Help("Items being scored on a worker thread now.")
                   .Register(registry)
                   .Add({})),
      rejected_(prometheus::BuildCounter()
                    .Name("tandem_verifier_rejected_batches_total")
                    .Help("Batches refused, by reason: busy "
                          "(max_concurrency) and batch_size "
                          "(max_batch_items) with RESOURCE_EXHAUSTED, "
                          "oversized (a field over its size limit) with "
                          "INVALID_ARGUMENT.")
                    .Register(registry)),
      stopped_(prometheus::BuildCounter()
                   .Name("tandem_verifier_items_stopped_total")
                   .Help("Items whose scoring was cut short (running "
                         "programs killed) or dropped before it started, by "
                         "reason: item_deadline, caller_deadline, "
                         "cancelled.")
                   .Register(registry)),
      sandbox_kills_(prometheus::BuildCounter()
                         .Name("tandem_verifier_sandbox_kills_total")
                         .Help("Sandboxed runs ended by force, by reason: "
                               "cpu, wall_clock, output, file_size, signal.")
                         .Register(registry)),
      auth_refused_(prometheus::BuildCounter()
                        .Name("tandem_verifier_auth_refused_total")
                        .Help("Calls refused by mutual-TLS authorization "
                              "(ScoreBatch needs the coordinator role, the "
                              "Environment service the rollout role), by "
                              "reason: unauthenticated, wrong_role, "
                              "other_member (another worker's episode). "
                              "Always 0 with tls.mode off.")
                        .Register(registry)) {
  for (const char* reason : {"unauthenticated", "wrong_role", "other_member"}) {
    auth_refused_.Add({{"reason", reason}});
  }
  for (absl::string_view reason : kAllKillReasons) {
    sandbox_kills_.Add({{"reason", std::string(reason)}});
  }
  for (absl::string_view reason : kRejectReasons) {
    rejected_.Add({{"reason", std::string(reason)}});
  }
  for (absl::string_view reason : kStopReasons) {
    stopped_.Add({{"reason", std::string(reason)}});
  }
}

void VerifierMetrics::CountRejected(absl::string_view reason) {
  rejected_.Add({{"reason", std::string(reason)}}).Increment();
}

void VerifierMetrics::CountStopped(absl::string_view reason, double items) {
  stopped_.Add({{"reason", std::string(reason)}}).Increment(items);
}

void VerifierMetrics::CountAuthRefused(absl::string_view reason) {
  auth_refused_.Add({{"reason", std::string(reason)}}).Increment();
}

void VerifierMetrics::CountSandboxKill(absl::string_view reason) {
  sandbox_kills_.Add({{"reason", std::string(reason)}}).Increment();
}

void VerifierMetrics::Observe(const std::string& verifier,
                              const std::string& outcome, double seconds) {
  requests_.Add({{"verifier", verifier}, {"outcome", outcome}}).Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30};
  seconds_.Add({{"verifier", verifier}}, kBuckets).Observe(seconds);
}

}  // namespace tandem::verifier
