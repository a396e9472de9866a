#include "services/coordinator/broadcast_epochs.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

BroadcastEpochs::BroadcastEpochs(BroadcastEpochsOptions options)
    : options_(std::move(options)) {}

void BroadcastEpochs::SetTrainer(const std::string& member_id,
                                 const std::string& store_address) {
  absl::MutexLock lock(&mu_);
  if (member_id == trainer_id_ && store_address == store_address_) return;
  trainer_id_ = member_id;
  store_address_ = store_address;
  trainer_changed_ = true;
  workers_.erase(member_id);
}

void BroadcastEpochs::Report(const tandem::v1::SyncWeightGroupRequest& report,
                             absl::Time now) {
  absl::MutexLock lock(&mu_);
  const bool from_trainer = report.member_id() == trainer_id_;
  if (report.failed_epoch() != 0) {
    ++stats_.failures_reported;
    if (report.failed_epoch() == current_.epoch() && !current_failed_) {
      current_failed_ = true;
      failed_at_ = now;
      failed_members_.assign(current_.member_ids().begin(),
                             current_.member_ids().end());
    }
    if (from_trainer && report.failed_epoch() == current_.epoch()) {
      resend_pending_ = true;
      latest_version_ = std::max(latest_version_, report.policy_version());
    }
  }
  if (from_trainer) return;
  Worker& w = workers_[report.member_id()];
  w.last = report;
  w.reported = now;
}

void BroadcastEpochs::RemoveMember(const std::string& member_id) {
  absl::MutexLock lock(&mu_);
  if (member_id == trainer_id_) {
    trainer_id_.clear();
    store_address_.clear();
    trainer_changed_ = true;
  }
  workers_.erase(member_id);
}

bool BroadcastEpochs::WasInFailedEpoch(const std::string& id) const {
  return std::find(failed_members_.begin(), failed_members_.end(), id) !=
         failed_members_.end();
}

bool BroadcastEpochs::IsSurvivor(const Worker& w, absl::Time now) const {
  return WasInFailedEpoch(w.last.member_id()) && w.reported > failed_at_ &&
         w.last.joined_epoch() == 0 && w.last.broadcast() &&
         now - w.reported <= options_.report_timeout;
}

bool BroadcastEpochs::IsCandidate(const Worker& w, uint64_t version,
                                  absl::Time now) const {
  if (!w.last.broadcast() || w.last.joined_epoch() != 0) return false;
  if (now - w.reported > options_.report_timeout) return false;
  if (w.last.policy_version() + 1 < version) return false;  // not caught up
  return !WasInFailedEpoch(w.last.member_id()) || w.reported > failed_at_;
}

void BroadcastEpochs::FormEpoch(const std::vector<std::string>& members,
                                uint64_t first_policy_version) {
  const uint64_t epoch = next_epoch_++;
  current_.Clear();
  current_.set_epoch(epoch);
  current_.set_store_address(store_address_);
  current_.set_key_prefix(
      absl::StrCat(options_.key_prefix_base, "/epoch", epoch));
  current_.set_backend(options_.backend);
  current_.set_first_policy_version(first_policy_version);
  for (const std::string& id : members) current_.add_member_ids(id);
  current_failed_ = false;
  trainer_changed_ = false;
  resend_pending_ = false;
  ++stats_.epochs_formed;
  stats_.epoch = current_.epoch();
  stats_.receivers = static_cast<uint32_t>(current_.member_ids_size() - 1);
}

tandem::v1::BroadcastGroup BroadcastEpochs::OnPublish(uint64_t version,
                                                      absl::Time now) {
  absl::MutexLock lock(&mu_);
  latest_version_ = std::max(latest_version_, version);
  if (!options_.enabled || trainer_id_.empty() || store_address_.empty()) {
    if (current_.epoch() != 0) current_.Clear();
    stats_.epoch = 0;
    stats_.receivers = 0;
    return current_;
  }
  // Current members that stay (none when the epoch failed or the trainer
  // changed: everyone rejoins from a fresh report).
  std::vector<std::string> keep;
  bool confirmed = true;
  if (!current_failed_ && !trainer_changed_) {
    for (int i = 1; i < current_.member_ids_size(); ++i) {
      auto it = workers_.find(current_.member_ids(i));
      if (it == workers_.end() || !it->second.last.broadcast()) continue;
      keep.push_back(it->first);
      if (it->second.last.joined_epoch() != current_.epoch()) {
        confirmed = false;
      }
    }
  }
  std::vector<std::string> members = {trainer_id_};
  members.insert(members.end(), keep.begin(), keep.end());
  // After the trainer's own broadcast failed, its next version goes out in
  // full, so the failed epoch's survivors need not hold v-1.
  const bool take_survivors = current_failed_ && resend_pending_;
  if (confirmed) {
    for (const auto& [id, w] : workers_) {
      if (std::find(keep.begin(), keep.end(), id) == keep.end() &&
          (IsCandidate(w, version, now) ||
           (take_survivors && IsSurvivor(w, now)))) {
        members.push_back(id);
      }
    }
  }
  const bool same =
      current_.epoch() != 0 && !current_failed_ && !trainer_changed_ &&
      current_.store_address() == store_address_ &&
      std::equal(members.begin(), members.end(), current_.member_ids().begin(),
                 current_.member_ids().end());
  if (!same) FormEpoch(members, version);
  stats_.epoch = current_.epoch();
  stats_.receivers = static_cast<uint32_t>(current_.member_ids_size() - 1);
  return current_;
}

std::optional<tandem::v1::BroadcastGroup> BroadcastEpochs::Regroup(
    absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!resend_pending_ || !current_failed_ || !options_.enabled ||
      trainer_changed_ || trainer_id_.empty() || store_address_.empty()) {
    return std::nullopt;
  }
  // Survivors: members of the failed epoch that are still registered and
  // said, after the failure, that they left the group.
  std::vector<std::string> survivors;
  bool all_reported = true;
  for (const std::string& id : failed_members_) {
    auto it = workers_.find(id);
    if (it == workers_.end()) continue;  // expired or deregistered
    const Worker& w = it->second;
    if (w.reported > failed_at_ && w.last.joined_epoch() == 0) {
      if (IsSurvivor(w, now)) survivors.push_back(id);
    } else {
      all_reported = false;
    }
  }
  const bool waited = now - failed_at_ >= options_.regroup_wait;
  if (!all_reported && !waited) return std::nullopt;
  const uint64_t version = latest_version_;
  std::vector<std::string> members = {trainer_id_};
  for (const auto& [id, w] : workers_) {
    if (std::find(survivors.begin(), survivors.end(), id) != survivors.end() ||
        (!WasInFailedEpoch(id) && IsCandidate(w, version, now))) {
      members.push_back(id);
    }
  }
  if (members.size() < 2) {
    // Nobody to re-send to; the next publish forms the next epoch.
    resend_pending_ = false;
    return std::nullopt;
  }
  FormEpoch(members, version);
  ++stats_.resend_epochs;
  return current_;
}

tandem::v1::BroadcastGroup BroadcastEpochs::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

BroadcastEpochStats BroadcastEpochs::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

WeightSyncGauges::WeightSyncGauges(prometheus::Registry& registry)
    : epoch_(prometheus::BuildGauge()
                 .Name("tandem_weight_sync_epoch")
                 .Help("Current membership epoch of the weight broadcast "
                       "group (0 = none).")
                 .Register(registry)
                 .Add({})),
      receivers_(prometheus::BuildGauge()
                     .Name("tandem_weight_sync_group_receivers")
                     .Help("Rollout workers in the current broadcast group.")
                     .Register(registry)
                     .Add({})),
      formed_(prometheus::BuildCounter()
                  .Name("tandem_weight_sync_epochs_formed_total")
                  .Help("Broadcast membership epochs formed.")
                  .Register(registry)
                  .Add({})),
      failures_(prometheus::BuildCounter()
                    .Name("tandem_weight_sync_failures_reported_total")
                    .Help("Failed collectives reported by members.")
                    .Register(registry)
                    .Add({})),
      resends_(prometheus::BuildCounter()
                   .Name("tandem_weight_sync_resend_epochs_total")
                   .Help("Broadcast epochs formed right after a failed one "
                         "to re-send the version it did not deliver.")
                   .Register(registry)
                   .Add({})) {}

void WeightSyncGauges::Update(const BroadcastEpochStats& stats) {
  epoch_.Set(static_cast<double>(stats.epoch));
  receivers_.Set(stats.receivers);
  formed_.Increment(
      static_cast<double>(stats.epochs_formed - last_.epochs_formed));
  failures_.Increment(
      static_cast<double>(stats.failures_reported - last_.failures_reported));
  resends_.Increment(
      static_cast<double>(stats.resend_epochs - last_.resend_epochs));
  last_ = stats;
}

}  // namespace tandem::coordinator
