#include "services/coordinator/group_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "services/coordinator/episode_rules.h"
#include "services/coordinator/sample_validation.h"

namespace tandem::coordinator {
namespace {

// Finished lease ids remembered for duplicate detection.
constexpr size_t kRememberedLeases = 100000;
// Versions whose trained group counts are remembered for ResumeTraining.
constexpr uint64_t kRememberedVersions = 100000;

bool Excluded(const Prompt& prompt, const std::vector<std::string>& excluded) {
  return !prompt.environment.empty() &&
         std::find(excluded.begin(), excluded.end(), prompt.environment) !=
             excluded.end();
}

}  // namespace

GroupLedger::GroupLedger(GroupLedgerOptions options,
                         std::unique_ptr<PromptSource> source)
    : options_(std::move(options)),
      source_(std::move(source)),
      training_(TrainingQueueOptions{options_.max_lag, options_.keep_stale,
                                     options_.batch_timeout},
                &pending_),
      // A group committed into version u is trainable until u + max_lag.
      history_(uint64_t{options_.max_lag} + 1, kRememberedVersions),
      groups_per_version_(std::max<uint64_t>(options_.groups_per_version, 1)) {}

std::unique_ptr<GroupState> GroupLedger::NewGroup(
    std::shared_ptr<const Prompt> prompt, const std::string& member_id,
    uint64_t worker_version, absl::Time now) {
  auto group = std::make_unique<GroupState>();
  const uint64_t id = next_id_++;
  group->group_id = absl::StrCat(options_.id_prefix, "-g", id);
  group->lease_id = absl::StrCat(options_.id_prefix, "-l", id);
  group->member_id = member_id;
  group->prompt = std::move(prompt);
  group->lease_deadline = now + options_.lease_timeout;
  group->dispatch_version = policy_version_;
  group->worker_version = worker_version;
  group->samples.resize(options_.group_size);
  group->scores.resize(options_.group_size);
  return group;
}

std::shared_ptr<const Prompt> GroupLedger::NextFromSourceLocked(
    const std::vector<std::string>& excluded, size_t* skipped) {
  while (!source_exhausted_) {
    if (!excluded.empty() && (*skipped >= kMaxSkippedPerLease ||
                              pending_.size() >= kMaxSkippedPending)) {
      return nullptr;
    }
    std::optional<Prompt> next = source_->Next();
    if (!next) {
      source_exhausted_ = true;
      return nullptr;
    }
    auto prompt = std::make_shared<const Prompt>(std::move(*next));
    if (!Excluded(*prompt, excluded)) return prompt;
    // Skipped: it waits with the pending prompts. Journaled (the source
    // moved on, the prompt is pending), so that a recovered ledger neither
    // loses it nor reads it or a later prompt twice.
    if (journal_) {
      journal::Record pending;
      *pending.mutable_pending()->mutable_prompt() = ToJournal(*prompt);
      pending.mutable_pending()->set_from_source(true);
      Record(pending);
    }
    pending_.push_back(std::move(prompt));
    ++*skipped;
  }
  return nullptr;
}

tandem::v1::LeasePromptsResponse GroupLedger::Lease(
    const std::string& member_id, uint32_t max_prompts, uint64_t worker_version,
    absl::Time now, const std::vector<std::string>& excluded) {
  tandem::v1::LeasePromptsResponse response;
  absl::MutexLock lock(&mu_);
  if (worker_version + options_.max_lag < policy_version_) {
    // Whatever this worker generates now would be too old to train on.
    response.set_retry_after_ms(
        absl::ToInt64Milliseconds(options_.throttle_retry));
    return response;
  }
  uint64_t in_flight =
      groups_.size() + training_.ready_groups() + training_.training_groups();
  // A group leased now is trained after the `in_flight` groups ahead of it,
  // about in_flight / groups_per_version versions later, and its tokens
  // are already `lag` versions old: keep the sum within max_lag so that
  // generated work is not dropped as stale.
  const uint64_t lag =
      policy_version_ > worker_version ? policy_version_ - worker_version : 0;
  const uint64_t limit =
      std::max<uint64_t>(options_.max_lag - lag, 1) * groups_per_version_;
  bool throttled = false;
  size_t skipped = 0;  // source prompts this lease skipped
  while (static_cast<uint32_t>(response.leases_size()) < max_prompts) {
    if (in_flight >= limit) {
      throttled = true;
      break;
    }
    std::shared_ptr<const Prompt> prompt;
    bool from_source = false;
    auto take = std::find_if(pending_.begin(), pending_.end(),
                             [&](const std::shared_ptr<const Prompt>& p) {
                               return !Excluded(*p, excluded);
                             });
    if (take != pending_.end()) {
      prompt = std::move(*take);
      pending_.erase(take);
    } else {
      prompt = NextFromSourceLocked(excluded, &skipped);
      if (prompt == nullptr) break;
      from_source = true;
    }
    std::unique_ptr<GroupState> group =
        NewGroup(std::move(prompt), member_id, worker_version, now);
    tandem::v1::PromptLease* lease = response.add_leases();
    lease->set_lease_id(group->lease_id);
    lease->set_group_id(group->group_id);
    lease->set_prompt_id(group->prompt->id);
    lease->mutable_prompt_token_ids()->Add(group->prompt->token_ids.begin(),
                                           group->prompt->token_ids.end());
    lease->set_prompt_text(group->prompt->text);
    lease->set_group_size(options_.group_size);
    *lease->mutable_sampling() = options_.sampling;
    lease->set_deadline_unix_ms(absl::ToUnixMillis(group->lease_deadline));
    lease->set_dispatch_policy_version(policy_version_);
    if (!group->prompt->environment.empty()) {
      // The environment scores the episode, so the worker passes it the
      // verifier and its inputs; a single-turn task's stay here.
      lease->set_environment(group->prompt->environment);
      lease->set_verifier(group->prompt->verifier);
      lease->mutable_reward_range()->set_min(group->prompt->reward_range.min);
      lease->mutable_reward_range()->set_max(group->prompt->reward_range.max);
      for (const auto& [key, value] : group->prompt->metadata) {
        (*lease->mutable_metadata())[key] = value;
      }
    }
    if (journal_) {
      journal::Record record;
      *record.mutable_dispatched()->mutable_group() = ToJournal(*group);
      record.mutable_dispatched()->set_from_source(from_source);
      Record(record);
    }
    InsertLeasedLocked(std::move(group));
    ++in_flight;
  }
  if (response.leases_size() == 0) {
    if (throttled) {
      response.set_retry_after_ms(
          absl::ToInt64Milliseconds(options_.throttle_retry));
    } else {
      response.set_retry_after_ms(
          absl::ToInt64Milliseconds(options_.empty_retry));
      // Leases still out may come back, so the stream is over only when
      // none is.
      response.set_exhausted(source_exhausted_ && pending_.empty() &&
                             leases_.empty());
    }
  }
  return response;
}

RenewResult GroupLedger::Renew(const std::string& member_id,
                               const std::vector<std::string>& lease_ids,
                               absl::Time now) {
  RenewResult result;
  result.deadline = now + options_.lease_timeout;
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids = lease_ids;
  if (ids.empty()) {
    auto it = member_leases_.find(member_id);
    if (it != member_leases_.end())
      ids.assign(it->second.begin(), it->second.end());
  }
  for (const std::string& lease_id : ids) {
    auto lease = leases_.find(lease_id);
    GroupState* group = nullptr;
    if (lease != leases_.end()) {
      auto it = groups_.find(lease->second);
      if (it != groups_.end()) group = it->second.get();
    }
    if (group == nullptr || group->member_id != member_id) {
      result.unknown.push_back(lease_id);
      continue;
    }
    group->lease_deadline = result.deadline;
    ++result.renewed;
  }
  return result;
}

void GroupLedger::InsertLeasedLocked(std::unique_ptr<GroupState> group) {
  if (!group->all_submitted()) {
    leases_[group->lease_id] = group->group_id;
    member_leases_[group->member_id].insert(group->lease_id);
  } else {
    RememberFinishedLease(group->lease_id);
  }
  scoring_samples_ += group->submitted - group->scored;
  const std::string group_id = group->group_id;
  groups_[group_id] = std::move(group);
  ++counters_.groups_dispatched;
  MaybeReadyLocked(group_id);
}

void GroupLedger::AbandonLocked(const std::string& group_id, bool expired) {
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return;
  if (journal_) {
    journal::Record record;
    record.mutable_abandoned()->set_group_id(group_id);
    record.mutable_abandoned()->set_expired(expired);
    Record(record);
  }
  if (expired) ++counters_.lease_expiries;
  GroupState& group = *it->second;
  scoring_samples_ -= group.submitted - group.scored;
  leases_.erase(group.lease_id);
  auto member = member_leases_.find(group.member_id);
  if (member != member_leases_.end()) {
    member->second.erase(group.lease_id);
    if (member->second.empty()) member_leases_.erase(member);
  }
  pending_.push_front(std::move(group.prompt));
  groups_.erase(it);
  ++counters_.groups_abandoned;
}

uint32_t GroupLedger::Return(const std::string& member_id,
                             const std::vector<std::string>& lease_ids) {
  absl::MutexLock lock(&mu_);
  uint32_t returned = 0;
  for (const std::string& lease_id : lease_ids) {
    auto lease = leases_.find(lease_id);
    if (lease == leases_.end()) continue;
    const std::string group_id = lease->second;
    if (groups_[group_id]->member_id != member_id) continue;
    AbandonLocked(group_id, /*expired=*/false);
    ++returned;
  }
  return returned;
}

uint32_t GroupLedger::ReleaseMember(const std::string& member_id) {
  absl::MutexLock lock(&mu_);
  auto it = member_leases_.find(member_id);
  if (it == member_leases_.end()) return 0;
  const std::set<std::string> lease_ids = it->second;
  for (const std::string& lease_id : lease_ids) {
    AbandonLocked(leases_[lease_id], /*expired=*/false);
  }
  return static_cast<uint32_t>(lease_ids.size());
}

uint32_t GroupLedger::ExpireLeases(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> expired;
  for (const auto& [lease_id, group_id] : leases_) {
    if (groups_[group_id]->lease_deadline <= now) expired.push_back(group_id);
  }
  // Oldest first, so the queue order does not depend on hashing.
  std::sort(expired.begin(), expired.end());
  for (auto it = expired.rbegin(); it != expired.rend(); ++it) {
    AbandonLocked(*it, /*expired=*/true);
  }
  return static_cast<uint32_t>(expired.size());
}

void GroupLedger::RememberFinishedLease(const std::string& lease_id) {
  finished_leases_.insert(lease_id);
  finished_order_.push_back(lease_id);
  while (finished_order_.size() > kRememberedLeases) {
    finished_leases_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
}

absl::StatusOr<SubmitResult> GroupLedger::Submit(
    const tandem::v1::SubmitSamplesRequest& request,
    const std::vector<std::string>& holders) {
  SubmitResult result;
  tandem::v1::SubmitSamplesResponse& response = result.response;
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckSubmitLocked(request, holders));
  for (const tandem::v1::Sample& sample : request.samples()) {
    auto lease = leases_.find(sample.lease_id());
    if (lease == leases_.end()) {
      if (finished_leases_.contains(sample.lease_id())) {
        response.set_duplicates(response.duplicates() + 1);
      } else {
        response.add_rejected_sample_ids(sample.sample_id());
      }
      continue;
    }
    const std::string group_id = lease->second;
    GroupState& group = *groups_[group_id];
    if ((!sample.group_id().empty() && sample.group_id() != group_id) ||
        sample.sample_index() >= group.samples.size()) {
      response.add_rejected_sample_ids(sample.sample_id());
      continue;
    }
    const uint32_t index = sample.sample_index();
    if (group.samples[index]) {
      response.set_duplicates(response.duplicates() + 1);
      continue;
    }
    if (journal_) {
      journal::Record record;
      record.mutable_sample()->set_group_id(group_id);
      *record.mutable_sample()->mutable_sample() = sample;
      if (record.sample().sample().worker_id().empty()) {
        record.mutable_sample()->mutable_sample()->set_worker_id(
            request.member_id());
      }
      Record(record);
    }
    ScoringTask task = AcceptSampleLocked(group, sample, request.member_id());
    response.set_accepted(response.accepted() + 1);
    if (!group.prompt->environment.empty()) {
      // An episode: the environment's reward is the score, journaled now.
      RecordScoreLocked(group_id, index, EpisodeScore(sample));
    } else {
      result.to_score.push_back(std::move(task));
    }
    MaybeReadyLocked(group_id);
  }
  return result;
}

absl::Status GroupLedger::CheckSubmitLocked(
    const tandem::v1::SubmitSamplesRequest& request,
    const std::vector<std::string>& holders) const {
  for (int i = 0; i < request.samples_size(); ++i) {
    const tandem::v1::Sample& sample = request.samples(i);
    auto lease = leases_.find(sample.lease_id());
    if (lease == leases_.end()) continue;  // rejected or a duplicate
    auto group = groups_.find(lease->second);
    if (group == groups_.end()) continue;
    const GroupState& state = *group->second;
    const bool held = holders.empty()
                          ? state.member_id == request.member_id()
                          : std::find(holders.begin(), holders.end(),
                                      state.member_id) != holders.end();
    if (!held) {
      return Refuse(
          SubmitRefusal::kLeaseNotHeld, absl::StatusCode::kPermissionDenied,
          absl::StrCat("samples[", i, "].lease_id '", sample.lease_id(),
                       "' is held by member '", state.member_id,
                       "', not by the submitting member '", request.member_id(),
                       "'"));
    }
    const uint64_t oldest = state.dispatch_version > options_.max_lag
                                ? state.dispatch_version - options_.max_lag
                                : 0;
    RETURN_IF_ERROR(ValidateSampleVersions(
        sample, i, oldest, policy_version_ + kVersionsAheadAllowed));
    RETURN_IF_ERROR(
        ValidateEpisodeForLease(sample, i, !state.prompt->environment.empty(),
                                state.prompt->reward_range));
  }
  return absl::OkStatus();
}

ScoringTask GroupLedger::AcceptSampleLocked(GroupState& group,
                                            const tandem::v1::Sample& sample,
                                            const std::string& member_id) {
  const uint32_t index = sample.sample_index();
  tandem::v1::Sample& stored = group.samples[index].emplace(sample);
  if (stored.sample_id().empty()) {
    stored.set_sample_id(absl::StrCat(sample.lease_id(), "/", index));
  }
  stored.set_group_id(group.group_id);
  if (stored.worker_id().empty()) stored.set_worker_id(member_id);
  ++group.submitted;
  group.tokens +=
      group.prompt->token_ids.size() + sample.completion_token_ids_size();
  ++counters_.samples_received;
  ++scoring_samples_;

  ScoringTask task;
  task.group_id = group.group_id;
  task.sample_index = index;
  task.item.set_item_id(stored.sample_id());
  task.item.set_verifier(group.prompt->verifier);
  task.item.set_prompt_text(group.prompt->text);
  task.item.set_completion_text(stored.completion_text());
  for (const auto& [key, value] : group.prompt->metadata) {
    (*task.item.mutable_metadata())[key] = value;
  }
  if (group.all_submitted()) {
    // The lease is done: its worker may die now without losing the group.
    leases_.erase(group.lease_id);
    auto member = member_leases_.find(group.member_id);
    if (member != member_leases_.end()) {
      member->second.erase(group.lease_id);
      if (member->second.empty()) member_leases_.erase(member);
    }
    RememberFinishedLease(group.lease_id);
  }
  return task;
}

bool GroupLedger::RecordScore(const std::string& group_id,
                              uint32_t sample_index,
                              const tandem::v1::Score& score) {
  absl::MutexLock lock(&mu_);
  return RecordScoreLocked(group_id, sample_index, score);
}

bool GroupLedger::RecordScoreLocked(const std::string& group_id,
                                    uint32_t sample_index,
                                    const tandem::v1::Score& score) {
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return false;
  GroupState& group = *it->second;
  if (sample_index >= group.scores.size() || group.scores[sample_index] ||
      !group.samples[sample_index]) {
    return false;
  }
  if (journal_) {
    journal::Record record;
    record.mutable_score()->set_group_id(group_id);
    record.mutable_score()->mutable_score()->set_index(sample_index);
    *record.mutable_score()->mutable_score()->mutable_score() = score;
    Record(record);
  }
  group.scores[sample_index] = score;
  ++group.scored;
  --scoring_samples_;
  const bool ready = group.all_submitted() && group.all_scored();
  MaybeReadyLocked(group_id);
  return ready;
}

void GroupLedger::MaybeReadyLocked(const std::string& group_id) {
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return;
  if (!it->second->all_submitted() || !it->second->all_scored()) return;
  std::unique_ptr<GroupState> group = std::move(it->second);
  groups_.erase(it);
  ComputeVersionRange(group.get());
  ++counters_.groups_completed;
  training_.AddReady(std::move(group), policy_version_);
}

tandem::v1::PullTrainingBatchResponse GroupLedger::Pull(
    const tandem::v1::PullTrainingBatchRequest& request, absl::Time now) {
  tandem::v1::PullTrainingBatchResponse response;
  std::string batch_id;
  Journal* journal = nullptr;
  uint64_t position = 0;
  {
    absl::MutexLock lock(&mu_);
    // The trainer's batch size is the consumption per version.
    if (request.max_groups() > 0) groups_per_version_ = request.max_groups();
    batch_id = absl::StrCat(options_.id_prefix, "-b", next_id_++);
    response = training_.Pull(request, batch_id, now);
    for (tandem::v1::ScoredGroup& group : *response.mutable_groups()) {
      *group.mutable_sampling() = options_.sampling;
    }
    if (journal_ && (!response.batch_id().empty() ||
                     response.dropped_stale_groups() > 0)) {
      journal::Record record;
      journal::Pulled* pulled = record.mutable_pulled();
      pulled->set_batch_id(batch_id);
      pulled->set_trainer_policy_version(request.trainer_policy_version());
      pulled->set_max_tokens(request.max_tokens());
      pulled->set_max_groups(request.max_groups());
      pulled->set_unix_ms(absl::ToUnixMillis(now));
      for (const auto& group : response.groups()) {
        pulled->add_group_ids(group.group_id());
      }
      pulled->set_member_id(request.member_id());
      position = Record(record);
      if (!response.batch_id().empty()) journal = journal_.get();
    }
  }
  // A batch handed out is never forgotten: the trainer may train it into
  // a version whatever happens to this process next (publish protocol).
  // Synced outside the lock (group commit): leases and submits go on.
  if (journal == nullptr) return response;
  if (absl::Status s = journal->SyncTo(position); !s.ok()) {
    ComponentLogger("coordinator")
        ->error("not handing out training batch {}: {}", batch_id,
                s.ToString());
    absl::MutexLock lock(&mu_);
    training_.ExpireBatch(batch_id);
    journal::Record expired;
    expired.mutable_batches_expired()->add_batch_ids(batch_id);
    Record(expired);
    tandem::v1::PullTrainingBatchResponse none;
    none.set_dropped_stale_groups(response.dropped_stale_groups());
    return none;
  }
  return response;
}

absl::StatusOr<CommitResult> GroupLedger::Commit(const std::string& batch_id,
                                                 uint64_t policy_version) {
  Journal* journal = nullptr;
  uint64_t position = 0;
  absl::StatusOr<CommitResult> result;
  {
    absl::MutexLock lock(&mu_);
    result = training_.Commit(batch_id, policy_version);
    if (result.ok() && !result->repeated) {
      history_.Add(policy_version, std::move(result->trained));
    }
    if (journal_ && result.ok() && !result->staleness.empty()) {
      journal::Record record;
      record.mutable_committed()->set_batch_id(batch_id);
      record.mutable_committed()->set_policy_version(policy_version);
      position = Record(record);
      journal = journal_.get();
    }
  }
  // A batch boundary: what the trainer is told is trained stays trained.
  if (journal != nullptr) RETURN_IF_ERROR(journal->SyncTo(position));
  return result;
}

uint32_t GroupLedger::ExpireBatches(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> expired = training_.ExpireBatches(now);
  if (journal_ && !expired.empty()) {
    journal::Record record;
    for (const auto& id : expired) {
      record.mutable_batches_expired()->add_batch_ids(id);
    }
    Record(record);
  }
  return static_cast<uint32_t>(expired.size());
}

void GroupLedger::LatestVersion(tandem::v1::WeightManifest* manifest,
                                std::string* weight_server_address) const {
  absl::MutexLock lock(&mu_);
  *manifest = manifest_;
  *weight_server_address = weight_server_address_;
}

uint64_t GroupLedger::Record(const journal::Record& record) {
  return journal_ ? journal_->Append(record) : 0;
}

uint64_t GroupLedger::policy_version() const {
  absl::MutexLock lock(&mu_);
  return policy_version_;
}

std::map<std::string, uint32_t> GroupLedger::LeasesByMember() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, uint32_t> held;
  for (const auto& [member_id, lease_ids] : member_leases_) {
    held[member_id] = static_cast<uint32_t>(lease_ids.size());
  }
  return held;
}

LedgerStats GroupLedger::Stats() const {
  absl::MutexLock lock(&mu_);
  LedgerStats stats = counters_;
  stats.policy_version = policy_version_;
  stats.pending_prompts = pending_.size();
  stats.leased_prompts = leases_.size();
  stats.scoring_samples = scoring_samples_;
  stats.ready_groups = training_.ready_groups();
  stats.training_groups = training_.training_groups();
  const TrainingQueueCounters& t = training_.counters();
  stats.groups_trained = t.groups_trained;
  stats.groups_dropped_stale = t.groups_dropped_stale;
  stats.groups_kept_stale = t.groups_kept_stale;
  stats.batches_expired = t.batches_expired;
  stats.batches_released = t.batches_released;
  stats.dataset_cursor = source_->cursor();
  if (journal_) {
    stats.journal_bytes = journal_->size_bytes();
    stats.journal_syncs = journal_->syncs();
    stats.journal_sync_seconds = journal_->sync_seconds();
  }
  stats.dataset_exhausted = source_exhausted_ && pending_.empty();
  return stats;
}

std::string GroupLedger::DescribeSource() const {
  absl::MutexLock lock(&mu_);
  return source_->Describe();
}

}  // namespace tandem::coordinator
