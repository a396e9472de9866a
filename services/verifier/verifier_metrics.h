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

// Why a batch was refused: the items admitted would pass max_concurrency
// ("busy"), or the batch has more than max_batch_items ("batch_size").
inline constexpr absl::string_view kRejectBusy = "busy";
inline constexpr absl::string_view kRejectBatchSize = "batch_size";
// A string or repeated field over its limit (INVALID_ARGUMENT,
// request_limits.h).
inline constexpr absl::string_view kRejectOversized = "oversized";
inline constexpr absl::string_view kRejectReasons[] = {
    kRejectBusy, kRejectBatchSize, kRejectOversized};
// Why an item was stopped: its own item_timeout_ms ("item_deadline"), its
// caller's gRPC deadline ("caller_deadline"), or the caller cancelled
// ("cancelled").
inline constexpr absl::string_view kStopItemDeadline = "item_deadline";
inline constexpr absl::string_view kStopCallerDeadline = "caller_deadline";
inline constexpr absl::string_view kStopCancelled = "cancelled";
inline constexpr absl::string_view kStopReasons[] = {
    kStopItemDeadline, kStopCallerDeadline, kStopCancelled};

class VerifierMetrics {
 public:
  explicit VerifierMetrics(prometheus::Registry& registry);
  void Observe(const std::string& verifier, const std::string& outcome,
               double seconds);
  // Items admitted and not finished (waiting for a thread or running).
  prometheus::Gauge& inflight() { return inflight_; }
  // Items on a worker thread now.
  prometheus::Gauge& running() { return running_; }
  // A batch refused with RESOURCE_EXHAUSTED; `reason` is one of
  // kRejectReasons.
  void CountRejected(absl::string_view reason);
  // Items whose scoring was cut short or dropped, by why; `reason` is one
  // of kStopReasons.
  void CountStopped(absl::string_view reason, double items = 1);
  // Counts a sandboxed run ended by force; `reason` is one of
  // kAllKillReasons.
  void CountSandboxKill(absl::string_view reason);
  // A ScoreBatch call refused by mutual-TLS authorization; `reason` is
  // "unauthenticated" or "wrong_role".
  void CountAuthRefused(absl::string_view reason);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Gauge& inflight_;
  prometheus::Gauge& running_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& stopped_;
  prometheus::Family<prometheus::Counter>& sandbox_kills_;
  prometheus::Family<prometheus::Counter>& auth_refused_;
};

}  // namespace tandem::verifier
