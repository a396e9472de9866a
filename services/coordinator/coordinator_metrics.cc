#include "services/coordinator/coordinator_metrics.h"

#include <algorithm>

#include "services/coordinator/member_registry.h"

namespace tandem::coordinator {
namespace {

prometheus::Counter* NewCounter(prometheus::Registry& registry,
                                const std::string& name,
                                const std::string& help,
                                const prometheus::Labels& labels = {}) {
  return &prometheus::BuildCounter()
              .Name(name)
              .Help(help)
              .Register(registry)
              .Add(labels);
}

prometheus::Histogram::BucketBoundaries StalenessBuckets() {
  return {0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64};
}

void Advance(prometheus::Counter* counter, uint64_t now, uint64_t before) {
  if (now > before) counter->Increment(static_cast<double>(now - before));
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : members_(prometheus::BuildGauge()
                   .Name("tandem_coordinator_members")
                   .Help("Cluster members known to the coordinator, by role "
                         "and state.")
                   .Register(registry)),
      expired_(prometheus::BuildCounter()
                   .Name("tandem_coordinator_members_expired_total")
                   .Help("Members declared dead after missing heartbeats.")
                   .Register(registry)),
      registrations_(prometheus::BuildCounter()
                         .Name("tandem_coordinator_registrations_total")
                         .Help("Successful member registrations, by role.")
                         .Register(registry)),
      policy_version_(&prometheus::BuildGauge()
                           .Name("tandem_policy_version")
                           .Help("Latest policy version this daemon knows.")
                           .Register(registry)
                           .Add({})),
      queue_depth_(prometheus::BuildGauge()
                       .Name("tandem_coordinator_queue_depth")
                       .Help("Work by lifecycle stage: prompts pending and "
                             "leased, samples scoring, groups ready and "
                             "training.")
                       .Register(registry)),
      pending_(&queue_depth_.Add({{"queue", "pending"}})),
      leased_(&queue_depth_.Add({{"queue", "leased"}})),
      scoring_(&queue_depth_.Add({{"queue", "scoring"}})),
      ready_(&queue_depth_.Add({{"queue", "ready"}})),
      training_(&queue_depth_.Add({{"queue", "training"}})),
      dispatched_(NewCounter(registry,
                             "tandem_coordinator_groups_dispatched_total",
                             "Groups leased to rollout workers.")),
      completed_(NewCounter(registry,
                            "tandem_coordinator_groups_completed_total",
                            "Groups whose samples were all scored.")),
      dropped_stale_(NewCounter(
          registry, "tandem_coordinator_groups_dropped_stale_total",
          "Scored groups dropped for exceeding the staleness bound (their "
          "prompts are leased again).")),
      trained_(NewCounter(registry, "tandem_coordinator_groups_trained_total",
                          "Groups committed by the trainer.")),
      abandoned_(NewCounter(
          registry, "tandem_coordinator_groups_abandoned_total",
          "Leases that ended unfinished (expired, returned, worker dead); "
          "their prompts were queued again.")),
      samples_(NewCounter(registry, "tandem_coordinator_samples_received_total",
                          "Samples accepted from rollout workers.")),
      lease_expiries_(NewCounter(registry,
                                 "tandem_coordinator_lease_expiries_total",
                                 "Prompt leases that passed their deadline.")),
      batches_expired_(NewCounter(
          registry, "tandem_coordinator_training_batches_expired_total",
          "Training batches not committed in time and handed out again.")),
      batches_released_(NewCounter(
          registry, "tandem_coordinator_training_batches_released_total",
          "Uncommitted training batches returned to the ready queue at once "
          "because the trainer member holding them died or left (or a new "
          "trainer resumed), or handed them back untrained "
          "(ReleaseTrainingBatch: a step skipped as non-finite).")),
      groups_requeued_(NewCounter(
          registry, "tandem_coordinator_groups_requeued_total",
          "Trained groups queued again because the trainer resumed from a "
          "checkpoint older than the version that trained them.")),
      groups_lost_(NewCounter(
          registry, "tandem_coordinator_groups_lost_total",
          "Trained groups gone from the weights because the trainer resumed "
          "from an older checkpoint, and too stale (max_lag) to train "
          "again.")),
      score_calls_(prometheus::BuildCounter()
                       .Name("tandem_coordinator_score_calls_total")
                       .Help("ScoreBatch calls to verifiers, by outcome.")
                       .Register(registry)),
      scoring_ok_(&score_calls_.Add({{"outcome", "ok"}})),
      scoring_failed_(&score_calls_.Add({{"outcome", "failed"}})),
      scoring_unroutable_(NewCounter(
          registry, "tandem_coordinator_scoring_unroutable_total",
          "Attempts to score a sample that found no live verifier replica "
          "serving its verifier name (one per sample per attempt).")),
      scoring_unroutable_waiting_(
          &prometheus::BuildGauge()
               .Name("tandem_coordinator_scoring_unroutable_samples")
               .Help("Samples waiting now because no live verifier replica "
                     "serves their verifier name.")
               .Register(registry)
               .Add({})),
      scoring_no_verifier_(NewCounter(
          registry, "tandem_coordinator_scoring_no_verifier_total",
          "Samples scored 0 because no replica served their verifier "
          "within scoring.unroutable_timeout_ms.")),
      scoring_non_finite_(NewCounter(
          registry, "tandem_coordinator_scoring_non_finite_rewards_total",
          "Samples scored 0 because their verifier returned a NaN or "
          "infinite reward (a verifier bug; the reward never reaches the "
          "group).")),
      journal_bytes_(&prometheus::BuildGauge()
                          .Name("tandem_coordinator_journal_bytes")
                          .Help("Size of the coordinator's journal.")
                          .Register(registry)
                          .Add({})),
      journal_syncs_(NewCounter(registry,
                                "tandem_coordinator_journal_syncs_total",
                                "fsyncs of the journal (batch boundaries and "
                                "compactions).")),
      journal_sync_seconds_(
          NewCounter(registry, "tandem_coordinator_journal_sync_seconds_total",
                     "Time spent in fsync of the journal.")),
      trained_staleness_(
          &prometheus::BuildHistogram()
               .Name("tandem_coordinator_trained_staleness_versions")
               .Help("Policy versions between the oldest token of a trained "
                     "group and the trainer's version.")
               .Register(registry)
               .Add({}, StalenessBuckets())),
      dispatch_staleness_(
          &prometheus::BuildHistogram()
               .Name("tandem_coordinator_dispatch_staleness_versions")
               .Help("Policy versions a rollout worker lagged behind the "
                     "latest version when it leased prompts.")
               .Register(registry)
               .Add({}, StalenessBuckets())),
      trainer_wait_(
          &prometheus::BuildCounter()
               .Name("tandem_coordinator_trainer_wait_seconds_total")
               .Help("Seconds PullTrainingBatch calls spent parked waiting "
                     "for ready groups: its rate is the fraction of time the "
                     "trainer starves for rollouts (the rollout autoscaling "
                     "signal, deploy/k8s/components/autoscaling).")
               .Register(registry)
               .Add({})),
      cluster_watchers_(&prometheus::BuildGauge()
                             .Name("tandem_coordinator_cluster_watchers")
                             .Help("Open WatchCluster streams (members and "
                                   "observers such as tandemctl watch).")
                             .Register(registry)
                             .Add({})),
      weight_group_syncs_(NewCounter(
          registry, "tandem_coordinator_weight_group_syncs_total",
          "SyncWeightGroup calls answered (broadcast members' reports and "
          "polls, the trainer's failure reports).")),
      submit_refusals_(
          prometheus::BuildCounter()
              .Name("tandem_coordinator_submit_refusals_total")
              .Help("SubmitSamples calls refused whole (nothing of them "
                    "stored), by reason: too_large, missing_lease, "
                    "logprob_count, logprob_value, token_id, version_spans, "
                    "version_range, lease_not_held, source_spans, episode.")
              .Register(registry)),
      oversized_requests_(
          prometheus::BuildCounter()
              .Name("tandem_coordinator_oversized_requests_total")
              .Help("Calls refused with INVALID_ARGUMENT because a string or "
                    "repeated field was over its size limit, by rpc.")
              .Register(registry)),
      auth_refused_(
          prometheus::BuildCounter()
              .Name("tandem_coordinator_auth_refused_total")
              .Help("Calls refused by mutual-TLS authorization, by reason: "
                    "unauthenticated (the client certificate names no "
                    "identity), wrong_role (its role may not call the RPC), "
                    "other_member (the member id belongs to another "
                    "identity). Always 0 with tls.mode off.")
              .Register(registry)) {
  for (AuthRefusal reason : kAllAuthRefusals) {
    auth_refused_.Add({{"reason", AuthRefusalLabel(reason)}});
  }
  for (SubmitRefusal reason : kAllSubmitRefusals) {
    submit_refusals_.Add({{"reason", SubmitRefusalLabel(reason)}});
  }
  for (auto role : {tandem::v1::ROLE_ROLLOUT, tandem::v1::ROLE_VERIFIER,
                    tandem::v1::ROLE_TRAINER}) {
    for (auto state :
         {tandem::v1::MEMBER_STATE_ALIVE, tandem::v1::MEMBER_STATE_DRAINING,
          tandem::v1::MEMBER_STATE_DEAD, tandem::v1::MEMBER_STATE_LEFT}) {
      SetMembers(role, state, 0);
    }
    expired_.Add({{"role", RoleName(role)}});
    registrations_.Add({{"role", RoleName(role)}});
  }
}

void CoordinatorMetrics::SetMembers(tandem::v1::Role role,
                                    tandem::v1::MemberState state,
                                    double count) {
  members_.Add({{"role", RoleName(role)}, {"state", MemberStateName(state)}})
      .Set(count);
}

void CoordinatorMetrics::CountExpired(tandem::v1::Role role) {
  expired_.Add({{"role", RoleName(role)}}).Increment();
}

void CoordinatorMetrics::CountSubmitRefusal(SubmitRefusal reason) {
  submit_refusals_.Add({{"reason", SubmitRefusalLabel(reason)}}).Increment();
}

void CoordinatorMetrics::CountAuthRefusal(AuthRefusal reason) {
  auth_refused_.Add({{"reason", AuthRefusalLabel(reason)}}).Increment();
}

void CoordinatorMetrics::CountOversizedRequest(const char* rpc) {
  oversized_requests_.Add({{"rpc", rpc}}).Increment();
}

void CoordinatorMetrics::CountRegistration(tandem::v1::Role role) {
  registrations_.Add({{"role", RoleName(role)}}).Increment();
}

void CoordinatorMetrics::Update(const LedgerStats& ledger,
                                const ScoringStats& scoring) {
  absl::MutexLock lock(&mu_);
  policy_version_->Set(static_cast<double>(ledger.policy_version));
  pending_->Set(static_cast<double>(ledger.pending_prompts));
  leased_->Set(static_cast<double>(ledger.leased_prompts));
  scoring_->Set(static_cast<double>(ledger.scoring_samples));
  ready_->Set(static_cast<double>(ledger.ready_groups));
  training_->Set(static_cast<double>(ledger.training_groups));
  const LedgerStats& l = last_ledger_;
  Advance(dispatched_, ledger.groups_dispatched, l.groups_dispatched);
  Advance(completed_, ledger.groups_completed, l.groups_completed);
  Advance(dropped_stale_, ledger.groups_dropped_stale, l.groups_dropped_stale);
  Advance(trained_, ledger.groups_trained, l.groups_trained);
  Advance(abandoned_, ledger.groups_abandoned, l.groups_abandoned);
  Advance(samples_, ledger.samples_received, l.samples_received);
  Advance(lease_expiries_, ledger.lease_expiries, l.lease_expiries);
  Advance(batches_expired_, ledger.batches_expired, l.batches_expired);
  Advance(batches_released_, ledger.batches_released, l.batches_released);
  Advance(groups_requeued_, ledger.groups_requeued, l.groups_requeued);
  Advance(groups_lost_, ledger.groups_lost, l.groups_lost);
  Advance(scoring_ok_, scoring.calls_ok, last_scoring_.calls_ok);
  Advance(scoring_failed_, scoring.calls_failed, last_scoring_.calls_failed);
  Advance(scoring_unroutable_, scoring.unroutable_attempts,
          last_scoring_.unroutable_attempts);
  scoring_unroutable_waiting_->Set(
      static_cast<double>(scoring.unroutable_waiting));
  Advance(scoring_no_verifier_, scoring.items_no_verifier,
          last_scoring_.items_no_verifier);
  Advance(scoring_non_finite_, scoring.items_non_finite,
          last_scoring_.items_non_finite);
  journal_bytes_->Set(static_cast<double>(ledger.journal_bytes));
  Advance(journal_syncs_, ledger.journal_syncs, l.journal_syncs);
  if (ledger.journal_sync_seconds > l.journal_sync_seconds) {
    journal_sync_seconds_->Increment(ledger.journal_sync_seconds -
                                     l.journal_sync_seconds);
  }
  last_ledger_ = ledger;
  last_scoring_ = scoring;
}

void CoordinatorMetrics::AddTrainerWait(absl::Duration parked) {
  trainer_wait_->Increment(std::max(0.0, absl::ToDoubleSeconds(parked)));
}

void CoordinatorMetrics::ObserveTrainedStaleness(uint64_t versions) {
  trained_staleness_->Observe(static_cast<double>(versions));
}

void CoordinatorMetrics::ObserveDispatchStaleness(uint64_t versions) {
  dispatch_staleness_->Observe(static_cast<double>(versions));
}

}  // namespace tandem::coordinator
