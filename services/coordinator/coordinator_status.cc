// GetClusterStatus: the read-only snapshot of members, versions, queues and
// counters that tandemctl, the launcher and the trainer poll (the other
// handlers are in coordinator.cc, coordinator_batches.cc and
// coordinator_publish.cc).

#include "services/coordinator/coordinator.h"

#include <map>
#include <string>

#include "common/weights/flat_weight_layout.h"
#include "services/coordinator/rpc_replies.h"

namespace tandem::coordinator {

using internal::Finish;

grpc::ServerUnaryReactor* Coordinator::GetClusterStatus(
    grpc::CallbackServerContext* context,
    const tandem::v1::GetClusterStatusRequest* request,
    tandem::v1::GetClusterStatusResponse* response) {
  if (grpc::Status auth =
          Authorize(CoordinatorRpc::kGetClusterStatus, *context, "");
      !auth.ok()) {
    return Finish(context, auth);
  }
  // The ledger, not the worker's report, knows which leases a member holds.
  const std::map<std::string, uint32_t> leases = ledger_->LeasesByMember();
  for (auto& member : members_.Snapshot()) {
    auto held = leases.find(member.member_id());
    member.mutable_load()->set_leases_held(held == leases.end() ? 0
                                                                : held->second);
    *response->add_members() = std::move(member);
  }
  const LedgerStats stats = ledger_->Stats();
  response->set_policy_version(stats.policy_version);
  tandem::v1::QueueDepths* queues = response->mutable_queues();
  queues->set_pending_prompts(stats.pending_prompts);
  queues->set_leased_prompts(stats.leased_prompts);
  queues->set_scoring_samples(stats.scoring_samples);
  queues->set_ready_groups(stats.ready_groups);
  queues->set_training_groups(stats.training_groups);
  tandem::v1::ClusterCounters* counters = response->mutable_counters();
  counters->set_groups_dispatched(stats.groups_dispatched);
  counters->set_groups_completed(stats.groups_completed);
  counters->set_groups_trained(stats.groups_trained);
  counters->set_groups_dropped_stale(stats.groups_dropped_stale);
  counters->set_samples_received(stats.samples_received);
  counters->set_lease_expiries(stats.lease_expiries);
  counters->set_members_expired(members_expired_);
  counters->set_groups_requeued(stats.groups_requeued);
  counters->set_groups_lost(stats.groups_lost);
  counters->set_batches_released(stats.batches_released);
  response->set_started_unix_ms(absl::ToUnixMillis(started_));
  *response->mutable_broadcast_group() = epochs_->Current();
  response->set_membership_epoch(response->broadcast_group().epoch());
  {
    tandem::v1::WeightManifest manifest;
    std::string weight_server_address;
    ledger_->LatestVersion(&manifest, &weight_server_address);
    response->set_weights_digest(weights::ManifestDigest(manifest));
  }
  response->set_max_lag(config_.max_lag);
  response->set_group_size(config_.group_size);
  return Finish(context, grpc::Status::OK);
}

}  // namespace tandem::coordinator
