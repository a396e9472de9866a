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
                    .Help("Items being scored now.")
                    .Register(registry)
                    .Add({})),
      rejected_(prometheus::BuildCounter()
                    .Name("tandem_verifier_rejected_batches_total")
                    .Help("Batches refused with RESOURCE_EXHAUSTED.")
                    .Register(registry)
                    .Add({})),
      sandbox_kills_(prometheus::BuildCounter()
                         .Name("tandem_verifier_sandbox_kills_total")
                         .Help("Sandboxed runs ended by force, by reason: "
                               "cpu, wall_clock, output, file_size, signal.")
                         .Register(registry)) {
  for (absl::string_view reason : kAllKillReasons) {
    sandbox_kills_.Add({{"reason", std::string(reason)}});
  }
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
