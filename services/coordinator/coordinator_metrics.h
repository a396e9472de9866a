#pragma once

// Metric families of the coordinator, declared once. Label sets are bounded:
// role (3 values), member state (4), queue (5), outcome (2), refusal reason
// (8, sample_validation.h), rpc (the service's 15 methods), auth refusal
// reason (3, coordinator_authz.h).

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/coordinator/coordinator_authz.h"
#include "services/coordinator/group_ledger.h"
#include "services/coordinator/sample_validation.h"
#include "services/coordinator/scoring_dispatcher.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  // Sets tandem_coordinator_members{role,state}.
  void SetMembers(tandem::v1::Role role, tandem::v1::MemberState state,
                  double count);
  void CountExpired(tandem::v1::Role role);
  void CountRegistration(tandem::v1::Role role);
  prometheus::Gauge& policy_version() { return *policy_version_; }

  // Open WatchCluster streams.
  prometheus::Gauge& cluster_watchers() { return *cluster_watchers_; }
  // One SyncWeightGroup call answered.
  void CountWeightGroupSync() { weight_group_syncs_->Increment(); }

  // One SubmitSamples call refused (tandem_coordinator_submit_refusals_total).
  void CountSubmitRefusal(SubmitRefusal reason);
  // One call of `rpc` refused for a field over its size limit
  // (tandem_coordinator_oversized_requests_total).
  void CountOversizedRequest(const char* rpc);
  // One call refused by authorization (tls.mode mtls only)
  // (tandem_coordinator_auth_refused_total).
  void CountAuthRefusal(AuthRefusal reason);

  // Brings queue gauges and work counters up to date with the ledger's and
  // the dispatcher's figures (counters advance by the difference since the
  // previous call). Thread-safe.
  void Update(const LedgerStats& ledger, const ScoringStats& scoring);
  // Staleness (in versions) of one trained group.
  void ObserveTrainedStaleness(uint64_t versions);
  // Versions a worker lagged behind the latest version when it was leased
  // prompts.
  void ObserveDispatchStaleness(uint64_t versions);
  // Time one PullTrainingBatch call spent parked, waiting for ready groups:
  // the trainer starving for rollouts.
  void AddTrainerWait(absl::Duration parked);

 private:
  prometheus::Family<prometheus::Gauge>& members_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& registrations_;
  prometheus::Gauge* policy_version_;

  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Gauge* pending_;
  prometheus::Gauge* leased_;
  prometheus::Gauge* scoring_;
  prometheus::Gauge* ready_;
  prometheus::Gauge* training_;
  prometheus::Counter* dispatched_;
  prometheus::Counter* completed_;
  prometheus::Counter* dropped_stale_;
  prometheus::Counter* trained_;
  prometheus::Counter* abandoned_;
  prometheus::Counter* samples_;
  prometheus::Counter* lease_expiries_;
  prometheus::Counter* batches_expired_;
  prometheus::Counter* batches_released_;
  prometheus::Counter* groups_requeued_;
  prometheus::Counter* groups_lost_;
  prometheus::Family<prometheus::Counter>& score_calls_;
  prometheus::Counter* scoring_ok_;
  prometheus::Counter* scoring_failed_;
  prometheus::Counter* scoring_unroutable_;
  prometheus::Gauge* scoring_unroutable_waiting_;
  prometheus::Counter* scoring_no_verifier_;
  prometheus::Counter* scoring_non_finite_;
  prometheus::Gauge* journal_bytes_;
  prometheus::Counter* journal_syncs_;
  prometheus::Counter* journal_sync_seconds_;
  prometheus::Histogram* trained_staleness_;
  prometheus::Histogram* dispatch_staleness_;
  prometheus::Counter* trainer_wait_;
  prometheus::Gauge* cluster_watchers_;
  prometheus::Counter* weight_group_syncs_;
  prometheus::Family<prometheus::Counter>& submit_refusals_;
  prometheus::Family<prometheus::Counter>& oversized_requests_;
  prometheus::Family<prometheus::Counter>& auth_refused_;

  absl::Mutex mu_;
  // Ledger and dispatcher totals at the previous Update.
  LedgerStats last_ledger_ ABSL_GUARDED_BY(mu_);
  ScoringStats last_scoring_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator
