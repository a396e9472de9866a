#include "services/coordinator/broadcast_epochs.h"

#include <algorithm>

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
  if (report.failed_epoch() != 0) {
    ++stats_.failures_reported;
    if (report.failed_epoch() == current_.epoch() && !current_failed_) {
      current_failed_ = true;
      failed_at_ = now;
      failed_members_.assign(current_.member_ids().begin(),
                             current_.member_ids().end());
    }
  }
  if (report.member_id() == trainer_id_) return;
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

bool BroadcastEpochs::IsCandidate(const Worker& w, uint64_t version,
                                  absl::Time now) const {
  if (!w.last.broadcast() || w.last.joined_epoch() != 0) return false;
  if (now - w.reported > options_.report_timeout) return false;
  if (w.last.policy_version() + 1 < version) return false;  // not caught up
  const bool was_in_failed =
      std::find(failed_members_.begin(), failed_members_.end(),
                w.last.member_id()) != failed_members_.end();
  return !was_in_failed || w.reported > failed_at_;
}

tandem::v1::BroadcastGroup BroadcastEpochs::OnPublish(uint64_t version,
                                                      absl::Time now) {
  absl::MutexLock lock(&mu_);
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
  if (confirmed) {
    for (const auto& [id, w] : workers_) {
      if (std::find(keep.begin(), keep.end(), id) == keep.end() &&
          IsCandidate(w, version, now)) {
        members.push_back(id);
      }
    }
  }
  const bool same =
      current_.epoch() != 0 && !current_failed_ && !trainer_changed_ &&
      current_.store_address() == store_address_ &&
      std::equal(members.begin(), members.end(), current_.member_ids().begin(),
                 current_.member_ids().end());
  if (!same) {
    const uint64_t epoch = next_epoch_++;
    current_.Clear();
    current_.set_epoch(epoch);
    current_.set_store_address(store_address_);
    current_.set_key_prefix(
        absl::StrCat(options_.key_prefix_base, "/epoch", epoch));
    current_.set_backend(options_.backend);
    current_.set_first_policy_version(version);
    for (const std::string& id : members) current_.add_member_ids(id);
    current_failed_ = false;
    trainer_changed_ = false;
    ++stats_.epochs_formed;
  }
  stats_.epoch = current_.epoch();
  stats_.receivers = static_cast<uint32_t>(current_.member_ids_size() - 1);
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
                    .Add({})) {}

void WeightSyncGauges::Update(const BroadcastEpochStats& stats) {
  epoch_.Set(static_cast<double>(stats.epoch));
  receivers_.Set(stats.receivers);
  formed_.Increment(
      static_cast<double>(stats.epochs_formed - last_.epochs_formed));
  failures_.Increment(
      static_cast<double>(stats.failures_reported - last_.failures_reported));
  last_ = stats;
}

}  // namespace tandem::coordinator
