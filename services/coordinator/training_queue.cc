#include "services/coordinator/training_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {
namespace {

// Expired and committed batch ids remembered for late or repeated commits.
constexpr size_t kRememberedBatches = 4096;

}  // namespace

TrainingQueue::TrainingQueue(
    TrainingQueueOptions options,
    std::deque<std::shared_ptr<const Prompt>>* retry_prompts)
    : options_(options), retry_prompts_(retry_prompts) {}

bool TrainingQueue::TooStale(const GroupState& group, uint64_t version) const {
  return version > group.min_version &&
         version - group.min_version > options_.max_lag;
}

void TrainingQueue::Retry(std::vector<std::unique_ptr<GroupState>> dropped) {
  counters_.groups_dropped_stale += dropped.size();
  dropped_since_pull_ += dropped.size();
  for (auto group = dropped.rbegin(); group != dropped.rend(); ++group) {
    retry_prompts_->push_front(std::move((*group)->prompt));
  }
}

bool TrainingQueue::AddReady(std::unique_ptr<GroupState> group,
                             uint64_t published_version) {
  if (!options_.keep_stale && TooStale(*group, published_version)) {
    std::vector<std::unique_ptr<GroupState>> dropped;
    dropped.push_back(std::move(group));
    Retry(std::move(dropped));
    return false;
  }
  ready_.push_back(std::move(group));
  return true;
}

uint32_t TrainingQueue::DropStale(uint64_t published_version) {
  if (options_.keep_stale) return 0;
  std::vector<std::unique_ptr<GroupState>> dropped;
  std::deque<std::unique_ptr<GroupState>> kept;
  for (std::unique_ptr<GroupState>& group : ready_) {
    if (TooStale(*group, published_version)) {
      dropped.push_back(std::move(group));
    } else {
      kept.push_back(std::move(group));
    }
  }
  ready_ = std::move(kept);
  const uint32_t count = static_cast<uint32_t>(dropped.size());
  Retry(std::move(dropped));
  return count;
}

tandem::v1::PullTrainingBatchResponse TrainingQueue::Pull(
    const tandem::v1::PullTrainingBatchRequest& request,
    const std::string& batch_id, absl::Time now) {
  const uint64_t version = request.trainer_policy_version();
  // Groups too old for this trainer can never be trained: versions only
  // grow.
  DropStale(version);
  tandem::v1::PullTrainingBatchResponse response;
  Batch batch;
  batch.trainer_version = version;
  batch.deadline = now + options_.batch_timeout;
  batch.member_id = request.member_id();
  uint64_t tokens = 0;
  while (!ready_.empty()) {
    const GroupState& next = *ready_.front();
    if (request.max_groups() > 0 &&
        batch.groups.size() >= request.max_groups()) {
      break;
    }
    if (request.max_tokens() > 0 && !batch.groups.empty() &&
        tokens + next.tokens > request.max_tokens()) {
      break;
    }
    if (TooStale(next, version)) ++counters_.groups_kept_stale;
    tokens += next.tokens;
    *response.add_groups() = ToScoredGroup(next);
    batch.groups.push_back(std::move(ready_.front()));
    ready_.pop_front();
  }
  response.set_dropped_stale_groups(static_cast<uint32_t>(dropped_since_pull_));
  dropped_since_pull_ = 0;
  if (batch.groups.empty()) return response;
  response.set_batch_id(batch_id);
  training_groups_ += batch.groups.size();
  batches_[batch_id] = std::move(batch);
  return response;
}

void TrainingQueue::Remember(std::map<std::string, uint32_t>* done,
                             std::deque<std::string>* order,
                             const std::string& batch_id, uint32_t count) {
  (*done)[batch_id] = count;
  order->push_back(batch_id);
  while (order->size() > kRememberedBatches) {
    done->erase(order->front());
    order->pop_front();
  }
}

absl::StatusOr<CommitResult> TrainingQueue::Commit(const std::string& batch_id,
                                                   uint64_t policy_version) {
  CommitResult result;
  if (auto it = committed_.find(batch_id); it != committed_.end()) {
    result.groups = it->second;
    result.repeated = true;
    return result;
  }
  std::vector<std::unique_ptr<GroupState>> groups;
  uint64_t trainer_version = 0;
  if (auto it = batches_.find(batch_id); it != batches_.end()) {
    groups = std::move(it->second.groups);
    trainer_version = it->second.trainer_version;
    training_groups_ -= groups.size();
    batches_.erase(it);
  } else if (auto late = expired_.find(batch_id); late != expired_.end()) {
    // A late commit counts only if every group is still waiting in the
    // ready queue; otherwise another batch holds (or trained) some of them.
    const std::vector<std::string>& ids = late->second.group_ids;
    std::vector<std::deque<std::unique_ptr<GroupState>>::iterator> found;
    for (auto g = ready_.begin(); g != ready_.end(); ++g) {
      if (std::find(ids.begin(), ids.end(), (*g)->group_id) != ids.end()) {
        found.push_back(g);
      }
    }
    if (found.size() != ids.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("batch ", batch_id,
                       " expired before its commit and was handed out again"));
    }
    for (auto g : found) groups.push_back(std::move(*g));
    std::erase_if(ready_, [](const std::unique_ptr<GroupState>& g) {
      return g == nullptr;
    });
    trainer_version = late->second.trainer_version;
    expired_.erase(late);
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown training batch '", batch_id, "'"));
  }
  (void)policy_version;
  result.groups = static_cast<uint32_t>(groups.size());
  for (const auto& group : groups) {
    result.tokens += group->tokens;
    result.staleness.push_back(trainer_version > group->min_version
                                   ? trainer_version - group->min_version
                                   : 0);
  }
  counters_.groups_trained += groups.size();
  Remember(&committed_, &committed_order_, batch_id, result.groups);
  result.trained = std::move(groups);
  return result;
}

void TrainingQueue::ExpireLocked(std::map<std::string, Batch>::iterator it,
                                 bool released, bool handed_back) {
  ExpiredBatch record;
  record.trainer_version = it->second.trainer_version;
  std::vector<std::unique_ptr<GroupState>>& groups = it->second.groups;
  training_groups_ -= groups.size();
  if (handed_back) {
    for (auto& g : groups) {
      record.group_ids.push_back(g->group_id);
      ready_.push_back(std::move(g));
    }
  } else {
    // Back to the front, keeping their order.
    for (auto g = groups.rbegin(); g != groups.rend(); ++g) {
      record.group_ids.push_back((*g)->group_id);
      ready_.push_front(std::move(*g));
    }
  }
  expired_[it->first] = std::move(record);
  expired_order_.push_back(it->first);
  while (expired_order_.size() > kRememberedBatches) {
    expired_.erase(expired_order_.front());
    expired_order_.pop_front();
  }
  batches_.erase(it);
  if (released) {
    ++counters_.batches_released;
  } else {
    ++counters_.batches_expired;
  }
}

std::vector<std::string> TrainingQueue::ExpireBatches(absl::Time now) {
  std::vector<std::string> expired;
  for (auto it = batches_.begin(); it != batches_.end();) {
    auto next = std::next(it);
    if (it->second.deadline <= now) {
      expired.push_back(it->first);
      ExpireLocked(it);
    }
    it = next;
  }
  return expired;
}

bool TrainingQueue::ExpireBatch(const std::string& batch_id, bool released,
                                bool handed_back) {
  auto it = batches_.find(batch_id);
  if (it == batches_.end()) return false;
  ExpireLocked(it, released, handed_back);
  return true;
}

absl::StatusOr<uint32_t> TrainingQueue::Release(const std::string& batch_id,
                                                const std::string& member_id) {
  auto it = batches_.find(batch_id);
  if (it == batches_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no open training batch '", batch_id,
        "' (committed, expired or released already, or never handed out)"));
  }
  if (!it->second.member_id.empty() && it->second.member_id != member_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("training batch '", batch_id, "' was pulled by '",
                     it->second.member_id, "', not '", member_id, "'"));
  }
  const auto groups = static_cast<uint32_t>(it->second.groups.size());
  ExpireLocked(it, /*released=*/true, /*handed_back=*/true);
  return groups;
}

void TrainingQueue::RenewOpenBatches(absl::Time deadline) {
  for (auto& [id, batch] : batches_) batch.deadline = deadline;
}

uint32_t TrainingQueue::Requeue(std::vector<std::unique_ptr<GroupState>> groups,
                                uint64_t trainer_version) {
  uint32_t requeued = 0;
  for (auto g = groups.rbegin(); g != groups.rend(); ++g) {
    if (!options_.keep_stale && TooStale(**g, trainer_version)) continue;
    ready_.push_front(std::move(*g));
    ++requeued;
  }
  return requeued;
}

void TrainingQueue::AddRestored(std::unique_ptr<GroupState> group) {
  ready_.push_back(std::move(group));
}

void TrainingQueue::AddOpenBatch(
    const std::string& batch_id, uint64_t trainer_version, absl::Time deadline,
    std::vector<std::unique_ptr<GroupState>> groups,
    const std::string& member_id) {
  Batch& batch = batches_[batch_id];
  batch.trainer_version = trainer_version;
  batch.deadline = deadline;
  batch.member_id = member_id;
  training_groups_ += groups.size();
  batch.groups = std::move(groups);
}

void TrainingQueue::AddExpiredBatch(const std::string& batch_id,
                                    uint64_t trainer_version,
                                    std::vector<std::string> group_ids) {
  expired_[batch_id] = ExpiredBatch{std::move(group_ids), trainer_version};
  expired_order_.push_back(batch_id);
}

void TrainingQueue::AppendSnapshot(
    std::vector<journal::Record>* records) const {
  for (const auto& [batch_id, batch] : batches_) {
    journal::OpenBatch* open = records->emplace_back().mutable_open_batch();
    open->set_batch_id(batch_id);
    open->set_trainer_policy_version(batch.trainer_version);
    open->set_deadline_unix_ms(absl::ToUnixMillis(batch.deadline));
    open->set_member_id(batch.member_id);
    for (const auto& group : batch.groups) {
      open->add_group_ids(group->group_id);
      *open->add_groups() = ToJournal(*group);
    }
  }
  for (const auto& group : ready_) {
    *records->emplace_back().mutable_ready()->mutable_group() =
        ToJournal(*group);
  }
  for (const std::string& batch_id : expired_order_) {
    auto it = expired_.find(batch_id);
    if (it == expired_.end()) continue;
    journal::OpenBatch* open = records->emplace_back().mutable_open_batch();
    open->set_batch_id(batch_id);
    open->set_trainer_policy_version(it->second.trainer_version);
    for (const auto& id : it->second.group_ids) open->add_group_ids(id);
  }
}

}  // namespace tandem::coordinator
