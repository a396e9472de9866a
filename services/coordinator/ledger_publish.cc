// GroupLedger's side of the publish protocol (group_ledger.h): batch-keyed
// idempotent publishes, a trainer resuming from an older checkpoint, and
// the release of batches whose trainer is gone.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "services/coordinator/group_ledger.h"

namespace tandem::coordinator {

absl::Status GroupLedger::PublishVersion(
    const tandem::v1::WeightManifest& manifest,
    const std::string& weight_server_address) {
  return PublishTrainedVersion(manifest, weight_server_address, "").status();
}

absl::Status GroupLedger::PublishVersion(uint64_t version) {
  tandem::v1::WeightManifest manifest;
  manifest.set_policy_version(version);
  return PublishVersion(manifest, "");
}

absl::StatusOr<PublishResult> GroupLedger::PublishTrainedVersion(
    const tandem::v1::WeightManifest& manifest,
    const std::string& weight_server_address, const std::string& batch_id) {
  PublishResult result;
  Journal* journal = nullptr;
  {
    absl::MutexLock lock(&mu_);
    journal = journal_.get();
    const uint64_t version = manifest.policy_version();
    if (!batch_id.empty() && version == policy_version_ &&
        batch_id == last_batch_id_) {
      // The same publish again: its answer was lost (a coordinator
      // restart, a timeout). Synced below, in case the first attempt's
      // sync failed or is still under way.
      result.duplicate = true;
    } else if (version != policy_version_ + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "policy versions go up by one: expected ", policy_version_ + 1,
          ", got ", version,
          batch_id.empty() ? std::string()
                           : absl::StrCat(" (batch '", batch_id, "')")));
    } else {
      ASSIGN_OR_RETURN(result.commit,
                       CommitAndPublishLocked(manifest, weight_server_address,
                                              batch_id, journal != nullptr));
    }
  }
  // Synced outside the lock (group commit), before the trainer is told.
  if (journal != nullptr) RETURN_IF_ERROR(journal->Sync());
  return result;
}

absl::StatusOr<CommitResult> GroupLedger::CommitAndPublishLocked(
    const tandem::v1::WeightManifest& manifest,
    const std::string& weight_server_address, const std::string& batch_id,
    bool journal) {
  const uint64_t version = manifest.policy_version();
  CommitResult commit;
  if (!batch_id.empty()) {
    absl::StatusOr<CommitResult> committed =
        training_.Commit(batch_id, version);
    if (!committed.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot publish version ", version, " for batch '",
                       batch_id, "': ", committed.status().message()));
    }
    if (committed->repeated) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot publish version ", version, " for batch '", batch_id,
          "': the batch was already committed into an earlier version"));
    }
    commit = *std::move(committed);
  }
  if (journal) {
    journal::Record record;
    journal::Published* published = record.mutable_published();
    published->set_policy_version(version);
    *published->mutable_manifest() = manifest;
    published->set_weight_server_address(weight_server_address);
    published->set_batch_id(batch_id);
    Record(record);
  }
  RETURN_IF_ERROR(PublishLocked(manifest, weight_server_address));
  last_batch_id_ = batch_id;
  if (!batch_id.empty()) history_.Add(version, std::move(commit.trained));
  return commit;
}

absl::Status GroupLedger::PublishLocked(
    const tandem::v1::WeightManifest& manifest,
    const std::string& weight_server_address) {
  policy_version_ = manifest.policy_version();
  manifest_ = manifest;
  if (!weight_server_address.empty()) {
    weight_server_address_ = weight_server_address;
  }
  training_.DropStale(policy_version_);
  return absl::OkStatus();
}

void GroupLedger::ReleaseLocked(const std::vector<std::string>& batch_ids) {
  if (batch_ids.empty() || !journal_) return;
  journal::Record record;
  record.mutable_batches_expired()->set_released(true);
  for (const auto& id : batch_ids) {
    record.mutable_batches_expired()->add_batch_ids(id);
  }
  Record(record);
}

absl::StatusOr<uint32_t> GroupLedger::ReleaseBatch(
    const std::string& member_id, const std::string& batch_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<uint32_t> groups = training_.Release(batch_id, member_id);
  if (groups.ok() && journal_) {
    journal::Record record;
    record.mutable_batches_expired()->set_released(true);
    record.mutable_batches_expired()->set_handed_back(true);
    record.mutable_batches_expired()->add_batch_ids(batch_id);
    Record(record);
  }
  return groups;
}

uint32_t GroupLedger::ReleaseBatches(
    const std::function<bool(const std::string&)>& gone) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> released = training_.ReleaseBatches(gone);
  ReleaseLocked(released);
  return static_cast<uint32_t>(released.size());
}

ResumeResult GroupLedger::RewindLocked(uint64_t version) {
  ResumeResult result;
  result.policy_version = policy_version_;
  if (version >= policy_version_) return result;
  TrainedHistory::Rewound rewound = history_.RewindTo(version);
  const uint64_t held = rewound.groups.size();
  result.groups_requeued =
      training_.Requeue(std::move(rewound.groups), policy_version_);
  result.groups_lost =
      static_cast<uint32_t>(rewound.dropped + held - result.groups_requeued);
  result.complete = rewound.complete;
  counters_.groups_requeued += result.groups_requeued;
  counters_.groups_lost += result.groups_lost;
  // The duplicate check must not match a version the trainer forgot.
  last_batch_id_.clear();
  return result;
}

absl::StatusOr<ResumeResult> GroupLedger::Resume(const std::string& member_id,
                                                 uint64_t trainer_version) {
  ResumeResult result;
  Journal* journal = nullptr;
  {
    absl::MutexLock lock(&mu_);
    journal = journal_.get();
    // One trainer trains: a trainer that (re)starts replaces every earlier
    // one, whose batches it would otherwise wait for.
    std::vector<std::string> released = training_.ReleaseBatches(
        [&](const std::string& holder) { return holder != member_id; });
    ReleaseLocked(released);
    if (journal_) {
      journal::Record record;
      record.mutable_resumed()->set_policy_version(trainer_version);
      record.mutable_resumed()->set_member_id(member_id);
      Record(record);
    }
    result = RewindLocked(trainer_version);
    result.batches_released = static_cast<uint32_t>(released.size());
  }
  if (journal != nullptr) RETURN_IF_ERROR(journal->Sync());
  return result;
}

}  // namespace tandem::coordinator
