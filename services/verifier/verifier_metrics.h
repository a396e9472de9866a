#pragma once

// Metric families of the verifier, declared once. Labels: verifier name
// (the registry's closed set) and outcome (kAllOutcomes).

#include <string>

#include "absl/strings/string_view.h"

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem::verifier {

class VerifierMetrics {
 public:
  explicit VerifierMetrics(prometheus::Registry& registry);
  void Observe(const std::string& verifier, const std::string& outcome,
               double seconds);
  prometheus::Gauge& inflight() { return inflight_; }
  prometheus::Counter& rejected() { return rejected_; }
  // Counts a sandboxed run ended by force; `reason` is one of
  // kAllKillReasons.
  void CountSandboxKill(absl::string_view reason);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Gauge& inflight_;
  prometheus::Counter& rejected_;
  prometheus::Family<prometheus::Counter>& sandbox_kills_;
};

}  // namespace tandem::verifier
