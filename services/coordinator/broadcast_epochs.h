#pragma once

// BroadcastEpochs: the coordinator's record of the weight broadcast group
// (trainer + rollout workers) as numbered membership epochs.
//
// Contract:
//   - The trainer is rank 0 and hosts the rendezvous store; without a
//     trainer store there is no group (epoch 0).
//   - Membership changes only at version boundaries: OnPublish(v) decides
//     the group that receives version v, forming epoch e+1 (with
//     first_policy_version = v and a key prefix never used before) when the
//     eligible set differs from the current group or the current epoch
//     failed; Regroup() forms one to re-send a version (below). Otherwise
//     the group stays as it is.
//   - A rollout worker becomes eligible (a "candidate") for an epoch whose
//     first version is v once it reports broadcast = true, is in no group
//     (joined_epoch 0), holds at least version v-1 (caught up by pull) and
//     reported within report_timeout. Candidates are added only when every
//     current member has confirmed it joined the current epoch (or it
//     failed), so epochs do not churn while a rendezvous is under way.
//   - A current member stays while it is live, keeps reporting broadcast =
//     true and the epoch has not failed. RemoveMember() (heartbeat expiry,
//     deregistration) takes effect at the next publish.
//   - After epoch e failed at time t, its members count as candidates again
//     only with a report made after t that says they left the group; a
//     killed worker never reports again and so is left out.
//   - Re-send: when the trainer reported that broadcasting to the current
//     epoch e failed, Regroup(now) forms epoch e+1 without waiting for the
//     next publish, as soon as every other member of e that is still
//     registered reported (after the failure) that it left the group, or
//     regroup_wait after the failure, whichever comes first. Its members
//     are the trainer, those survivors (whatever version they hold: the
//     trainer re-sends in full) and the other candidates; its
//     first_policy_version is the latest published version, which e did
//     not deliver (the trainer drops a failed epoch's remaining versions).
//     A publish before that forms e+1 instead, with the same survivors
//     (the trainer's next version after its failure goes out in full); with
//     no receiver left, nothing is formed and the next publish decides.
//     Only the
//     trainer's report triggers a re-send: the trainer then polls for e+1
//     and is sure to serve it, so receivers never wait for a sender that
//     does not come.
//
// Thread-safe. Time is passed in, so tests drive it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

struct BroadcastEpochsOptions {
  // Off: no group is ever formed; every worker pulls.
  bool enabled = true;
  // Key prefixes are "<key_prefix_base>/epoch<e>"; the base should differ
  // per coordinator incarnation so prefixes are unique across restarts.
  std::string key_prefix_base = "tandem/weights";
  std::string backend = "gloo";
  // A candidate's last report must be at most this old.
  absl::Duration report_timeout = absl::Seconds(2);
  // How long Regroup() waits for members of a failed epoch to report that
  // they left it (a killed one never does) before re-sending without them.
  absl::Duration regroup_wait = absl::Milliseconds(500);
};

struct BroadcastEpochStats {
  uint64_t epoch = 0;
  uint32_t receivers = 0;  // ranks 1..n-1 of the current group
  uint64_t epochs_formed = 0;
  uint64_t failures_reported = 0;
  uint64_t resend_epochs = 0;  // epochs formed by Regroup()
};

class BroadcastEpochs {
 public:
  explicit BroadcastEpochs(BroadcastEpochsOptions options);

  // The trainer `member_id` hosts the store at `store_address` (host:port).
  // A different trainer (or address) forces a new epoch at the next publish.
  void SetTrainer(const std::string& member_id,
                  const std::string& store_address);

  // Records a member's report. A report with failed_epoch == the current
  // epoch marks it failed (from the trainer or a worker); the trainer's
  // also asks for a re-send (Regroup).
  void Report(const tandem::v1::SyncWeightGroupRequest& report, absl::Time now);

  // The member is gone (expired, deregistered): it leaves at the next
  // publish; a trainer that goes removes the group.
  void RemoveMember(const std::string& member_id);

  // Decides the group that receives `version` (see the contract above).
  tandem::v1::BroadcastGroup OnPublish(uint64_t version, absl::Time now);

  // Re-send after a failure (see the contract): returns the epoch formed,
  // or nullopt when none was (no re-send pending, still waiting for
  // reports, or nobody left to receive). Call after reports and
  // periodically.
  std::optional<tandem::v1::BroadcastGroup> Regroup(absl::Time now);

  // The current group (epoch 0 when none).
  tandem::v1::BroadcastGroup Current() const;

  BroadcastEpochStats Stats() const;

 private:
  struct Worker {
    tandem::v1::SyncWeightGroupRequest last;
    absl::Time reported;
    bool removed = false;
  };

  bool IsCandidate(const Worker& w, uint64_t version, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WasInFailedEpoch(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member of the failed epoch that reported since, outside any group.
  bool IsSurvivor(const Worker& w, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `members` (trainer first) the current group as a new epoch.
  void FormEpoch(const std::vector<std::string>& members,
                 uint64_t first_policy_version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BroadcastEpochsOptions options_;
  mutable absl::Mutex mu_;
  std::string trainer_id_ ABSL_GUARDED_BY(mu_);
  std::string store_address_ ABSL_GUARDED_BY(mu_);
  bool trainer_changed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  tandem::v1::BroadcastGroup current_ ABSL_GUARDED_BY(mu_);
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  // Failure of the current epoch (and when it was reported).
  bool current_failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time failed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<std::string> failed_members_ ABSL_GUARDED_BY(mu_);
  // The trainer reported the current epoch's failure: a re-send is due.
  bool resend_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Newest version published (or reported failed by the trainer).
  uint64_t latest_version_ ABSL_GUARDED_BY(mu_) = 0;
  BroadcastEpochStats stats_ ABSL_GUARDED_BY(mu_);
};

// The coordinator's weight-sync metric families:
//   tandem_weight_sync_epoch                      gauge (current epoch)
//   tandem_weight_sync_group_receivers            gauge (its receivers)
//   tandem_weight_sync_epochs_formed_total        counter
//   tandem_weight_sync_failures_reported_total    counter
//   tandem_weight_sync_resend_epochs_total        counter
class WeightSyncGauges {
 public:
  explicit WeightSyncGauges(prometheus::Registry& registry);
  void Update(const BroadcastEpochStats& stats);

 private:
  prometheus::Gauge& epoch_;
  prometheus::Gauge& receivers_;
  prometheus::Counter& formed_;
  prometheus::Counter& failures_;
  prometheus::Counter& resends_;
  BroadcastEpochStats last_;
};

}  // namespace tandem::coordinator
