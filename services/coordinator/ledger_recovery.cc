// GroupLedger's journal replay and compaction (see journal.h).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "services/coordinator/episode_rules.h"
#include "services/coordinator/group_ledger.h"

namespace tandem::coordinator {

absl::Status GroupLedger::ApplyLocked(const journal::Record& record) {
  switch (record.record_case()) {
    case journal::Record::kDispatched: {
      const journal::Dispatched& d = record.dispatched();
      if (d.from_source()) {
        if (!source_->Next()) source_exhausted_ = true;
      } else {
        auto it = std::find_if(pending_.begin(), pending_.end(),
                               [&](const auto& prompt) {
                                 return prompt->id == d.group().prompt().id();
                               });
        if (it != pending_.end()) pending_.erase(it);
      }
      InsertLeasedLocked(FromJournal(d.group(), options_.group_size));
      return absl::OkStatus();
    }
    case journal::Record::kSample: {
      auto it = groups_.find(record.sample().group_id());
      const tandem::v1::Sample& sample = record.sample().sample();
      if (it == groups_.end() ||
          sample.sample_index() >= it->second->samples.size() ||
          it->second->samples[sample.sample_index()]) {
        return absl::OkStatus();
      }
      AcceptSampleLocked(*it->second, sample, sample.worker_id());
      if (!it->second->prompt->environment.empty()) {
        // As Submit did: the score follows from the sample alone, so it is
        // the same whether or not its Score record survived.
        RecordScoreLocked(record.sample().group_id(), sample.sample_index(),
                          EpisodeScore(sample));
      }
      MaybeReadyLocked(record.sample().group_id());
      return absl::OkStatus();
    }
    case journal::Record::kScore:
      RecordScoreLocked(record.score().group_id(),
                        record.score().score().index(),
                        record.score().score().score());
      return absl::OkStatus();
    case journal::Record::kAbandoned:
      AbandonLocked(record.abandoned().group_id(),
                    record.abandoned().expired());
      return absl::OkStatus();
    case journal::Record::kPulled: {
      const journal::Pulled& p = record.pulled();
      tandem::v1::PullTrainingBatchRequest request;
      request.set_trainer_policy_version(p.trainer_policy_version());
      request.set_max_tokens(p.max_tokens());
      request.set_max_groups(p.max_groups());
      request.set_member_id(p.member_id());
      tandem::v1::PullTrainingBatchResponse response = training_.Pull(
          request, p.batch_id(), absl::FromUnixMillis(p.unix_ms()));
      std::vector<std::string> ids;
      for (const auto& group : response.groups())
        ids.push_back(group.group_id());
      if (ids != std::vector<std::string>(p.group_ids().begin(),
                                          p.group_ids().end())) {
        return absl::DataLossError(absl::StrCat(
            "replayed training batch ", p.batch_id(),
            " does not match the journal (was the configuration changed?)"));
      }
      return absl::OkStatus();
    }
    case journal::Record::kCommitted: {
      // A failure here means the commit was refused the first time too.
      absl::StatusOr<CommitResult> result = training_.Commit(
          record.committed().batch_id(), record.committed().policy_version());
      if (result.ok() && !result->repeated) {
        history_.Add(record.committed().policy_version(),
                     std::move(result->trained));
      }
      return absl::OkStatus();
    }
    case journal::Record::kBatchesExpired:
      for (const auto& id : record.batches_expired().batch_ids()) {
        training_.ExpireBatch(id, record.batches_expired().released(),
                              record.batches_expired().handed_back());
      }
      return absl::OkStatus();
    case journal::Record::kPublished: {
      const journal::Published& p = record.published();
      if (p.snapshot()) {
        RETURN_IF_ERROR(PublishLocked(p.manifest(), p.weight_server_address()));
        last_batch_id_ = p.batch_id();
        return absl::OkStatus();
      }
      absl::StatusOr<CommitResult> committed = CommitAndPublishLocked(
          p.manifest(), p.weight_server_address(), p.batch_id(),
          /*journal=*/false);
      if (committed.ok()) return absl::OkStatus();
      // Recorded only after the commit succeeded, so this cannot happen;
      // keep the version rather than stop the replay.
      ComponentLogger("coordinator")
          ->warn("journal replay: {}; publishing version {} anyway",
                 committed.status().ToString(), p.policy_version());
      return PublishLocked(p.manifest(), p.weight_server_address());
    }
    case journal::Record::kResumed:
      RewindLocked(record.resumed().policy_version());
      return absl::OkStatus();
    case journal::Record::kTrainedVersion:
      history_.Restore(record.trained_version(), options_.group_size);
      return absl::OkStatus();
    case journal::Record::kSourceSkipped:
      for (uint64_t i = 0; i < record.source_skipped().prompts(); ++i) {
        if (!source_->Next()) {
          source_exhausted_ = true;
          break;
        }
      }
      return absl::OkStatus();
    case journal::Record::kPending:
      if (record.pending().from_source() && !source_->Next()) {
        source_exhausted_ = true;
      }
      pending_.push_back(std::make_shared<const Prompt>(
          FromJournal(record.pending().prompt())));
      return absl::OkStatus();
    case journal::Record::kReady: {
      std::unique_ptr<GroupState> group =
          FromJournal(record.ready().group(), options_.group_size);
      RememberFinishedLease(group->lease_id);
      training_.AddRestored(std::move(group));
      return absl::OkStatus();
    }
    case journal::Record::kOpenBatch: {
      const journal::OpenBatch& open = record.open_batch();
      if (open.groups_size() == 0) {
        training_.AddExpiredBatch(
            open.batch_id(), open.trainer_policy_version(),
            std::vector<std::string>(open.group_ids().begin(),
                                     open.group_ids().end()));
        return absl::OkStatus();
      }
      std::vector<std::unique_ptr<GroupState>> groups;
      for (const auto& group : open.groups()) {
        groups.push_back(FromJournal(group, options_.group_size));
        RememberFinishedLease(groups.back()->lease_id);
      }
      training_.AddOpenBatch(open.batch_id(), open.trainer_policy_version(),
                             absl::FromUnixMillis(open.deadline_unix_ms()),
                             std::move(groups), open.member_id());
      return absl::OkStatus();
    }
    case journal::Record::kState: {
      const journal::State& state = record.state();
      counters_.groups_dispatched = state.groups_dispatched();
      counters_.groups_completed = state.groups_completed();
      counters_.groups_abandoned = state.groups_abandoned();
      counters_.samples_received = state.samples_received();
      counters_.lease_expiries = state.lease_expiries();
      TrainingQueueCounters& t = training_.mutable_counters();
      t.groups_trained = state.groups_trained();
      t.groups_dropped_stale = state.groups_dropped_stale();
      t.groups_kept_stale = state.groups_kept_stale();
      t.batches_expired = state.batches_expired();
      t.batches_released = state.batches_released();
      counters_.groups_requeued = state.groups_requeued();
      counters_.groups_lost = state.groups_lost();
      return absl::OkStatus();
    }
    case journal::Record::RECORD_NOT_SET:
      break;
  }
  return absl::DataLossError("journal record of unknown type");
}

std::vector<journal::Record> GroupLedger::SnapshotLocked() const {
  std::vector<journal::Record> records;
  if (policy_version_ > 0) {
    journal::Published* published = records.emplace_back().mutable_published();
    published->set_policy_version(policy_version_);
    *published->mutable_manifest() = manifest_;
    published->mutable_manifest()->set_policy_version(policy_version_);
    published->set_weight_server_address(weight_server_address_);
    published->set_batch_id(last_batch_id_);
    published->set_snapshot(true);
  }
  records.emplace_back().mutable_source_skipped()->set_prompts(
      source_->cursor());
  // In-flight groups before pending prompts, so that their replay (which
  // looks for the prompt in the pending queue) takes nothing from it.
  std::vector<const GroupState*> in_flight;
  for (const auto& [id, group] : groups_) in_flight.push_back(group.get());
  std::sort(in_flight.begin(), in_flight.end(),
            [](const GroupState* a, const GroupState* b) {
              return a->group_id < b->group_id;
            });
  for (const GroupState* group : in_flight) {
    *records.emplace_back().mutable_dispatched()->mutable_group() =
        ToJournal(*group);
  }
  for (const auto& prompt : pending_) {
    *records.emplace_back().mutable_pending()->mutable_prompt() =
        ToJournal(*prompt);
  }
  training_.AppendSnapshot(&records);
  history_.AppendSnapshot(&records);
  journal::State* state = records.emplace_back().mutable_state();
  state->set_next_id(next_id_);
  state->set_groups_dispatched(counters_.groups_dispatched);
  state->set_groups_completed(counters_.groups_completed);
  state->set_groups_abandoned(counters_.groups_abandoned);
  state->set_samples_received(counters_.samples_received);
  state->set_lease_expiries(counters_.lease_expiries);
  const TrainingQueueCounters& t = training_.counters();
  state->set_groups_trained(t.groups_trained);
  state->set_groups_dropped_stale(t.groups_dropped_stale);
  state->set_groups_kept_stale(t.groups_kept_stale);
  state->set_batches_expired(t.batches_expired);
  state->set_batches_released(t.batches_released);
  state->set_groups_requeued(counters_.groups_requeued);
  state->set_groups_lost(counters_.groups_lost);
  return records;
}

absl::Status GroupLedger::Recover(std::unique_ptr<Journal> journal,
                                  absl::Time now,
                                  std::vector<ScoringTask>* to_score) {
  absl::MutexLock lock(&mu_);
  uint64_t dropped_bytes = 0;
  RETURN_IF_ERROR(journal->Replay(
      [this](const journal::Record& record)
          ABSL_NO_THREAD_SAFETY_ANALYSIS { return ApplyLocked(record); },
      &dropped_bytes));
  if (dropped_bytes > 0) {
    ComponentLogger("coordinator")
        ->warn(
            "{}: cut off a torn tail of {} bytes (a crash before the "
            "last sync)",
            journal->path(), dropped_bytes);
  }
  // The trainer that held a restored batch gets a full batch_timeout to
  // publish it (the coordinator was down meanwhile); a trainer that is
  // gone releases it sooner (Coordinator: holder not live).
  training_.RenewOpenBatches(now + options_.batch_timeout);
  // The workers that held the restored leases register again under new
  // ids; they get a full lease period to deliver before the prompts go
  // back to the queue.
  for (auto& [id, group] : groups_) {
    group->lease_deadline = now + options_.lease_timeout;
    for (size_t i = 0; i < group->samples.size(); ++i) {
      if (!group->samples[i] || group->scores[i]) continue;
      ScoringTask task;
      task.group_id = group->group_id;
      task.sample_index = static_cast<uint32_t>(i);
      const tandem::v1::Sample& sample = *group->samples[i];
      task.item.set_item_id(sample.sample_id());
      task.item.set_verifier(group->prompt->verifier);
      task.item.set_prompt_text(group->prompt->text);
      task.item.set_completion_text(sample.completion_text());
      for (const auto& [key, value] : group->prompt->metadata) {
        (*task.item.mutable_metadata())[key] = value;
      }
      to_score->push_back(std::move(task));
    }
  }
  RETURN_IF_ERROR(journal->Rewrite(SnapshotLocked()));
  journal_ = std::move(journal);
  return absl::OkStatus();
}

Journal* GroupLedger::journal() const {
  absl::MutexLock lock(&mu_);
  return journal_.get();
}

absl::Status GroupLedger::FlushJournal() {
  Journal* j = journal();
  return j ? j->Flush() : absl::OkStatus();
}

absl::Status GroupLedger::SyncJournal() {
  Journal* j = journal();
  return j ? j->Sync() : absl::OkStatus();
}

absl::Status GroupLedger::MaybeCompactJournal(uint64_t max_bytes) {
  Journal* j = journal();
  if (j == nullptr || j->size_bytes() <= max_bytes) return absl::OkStatus();
  // The snapshot is taken under mu_; the new file is written and synced
  // outside it.
  return j->Compact([this, j] {
    absl::MutexLock lock(&mu_);
    return Journal::Snapshot{SnapshotLocked(), j->appended()};
  });
}

uint64_t GroupLedger::journal_bytes() const {
  absl::MutexLock lock(&mu_);
  return journal_ ? journal_->size_bytes() : 0;
}

}  // namespace tandem::coordinator
