#pragma once

// TrainingQueue holds scored groups until the trainer has trained them:
// a FIFO of ready groups, the batches handed out and not yet committed, and
// the staleness bound.
//
// Staleness: a trainer at policy version T (training produces T + 1) may
// receive a group only if T - min_version <= max_lag, where min_version is
// the oldest policy version of any token in the group. Groups beyond that
// bound are dropped and counted (or, with keep_stale, handed out anyway for
// importance-sampling correction downstream). Since versions only grow,
// a group too old for the latest published version is dropped at once.
// A dropped group's samples are discarded but its prompt is not: it goes
// back to the front of the ledger's pending prompts (`retry_prompts`), to
// be generated again with newer weights, so that a finite dataset is
// still trained whole.
//
// Each group is trained at most once: a batch not committed before its
// deadline goes back to the front of the ready queue, and a late commit of
// such a batch succeeds only if none of its groups was handed out again.
//
// Not thread-safe: the GroupLedger calls it under its mutex.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/group_state.h"
#include "services/coordinator/journal.pb.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

struct TrainingQueueOptions {
  uint32_t max_lag = 4;
  bool keep_stale = false;
  absl::Duration batch_timeout = absl::Minutes(5);
};

// What a commit trained, for metrics.
struct CommitResult {
  uint32_t groups = 0;
  uint64_t tokens = 0;
  // Per group: trainer version at pull minus the group's min_version.
  std::vector<uint64_t> staleness;
  // The batch had been committed before: nothing was trained now.
  bool repeated = false;
  // The groups trained (empty when repeated), for TrainedHistory.
  std::vector<std::unique_ptr<GroupState>> trained;
};

struct TrainingQueueCounters {
  uint64_t groups_trained = 0;
  uint64_t groups_dropped_stale = 0;
  uint64_t groups_kept_stale = 0;
  uint64_t batches_expired = 0;
  uint64_t batches_released = 0;
};

class TrainingQueue {
 public:
  // `retry_prompts`: where the prompts of groups dropped as stale go (the
  // ledger's pending queue, guarded by the same mutex); not owned.
  TrainingQueue(TrainingQueueOptions options,
                std::deque<std::shared_ptr<const Prompt>>* retry_prompts);

  // Adds a fully scored group at the back of the ready queue, unless it is
  // already too old for `published_version` (then it is dropped and its
  // prompt retried; returns false).
  bool AddReady(std::unique_ptr<GroupState> group, uint64_t published_version);

  // Drops ready groups too old for `published_version` (their prompts are
  // retried); returns how many.
  uint32_t DropStale(uint64_t published_version);

  // Hands out ready groups in FIFO order within the request's token budget
  // (max_tokens, 0 = none) and group bound (max_groups, 0 = none); a single
  // group larger than the budget is still handed out alone. Empty batch_id
  // when nothing is ready.
  tandem::v1::PullTrainingBatchResponse Pull(
      const tandem::v1::PullTrainingBatchRequest& request,
      const std::string& batch_id, absl::Time now);

  // Marks the batch trained. NotFound for an unknown batch id;
  // FailedPrecondition when the batch expired and some of its groups were
  // handed out again. Committing the same batch twice returns the first
  // result's group count and trains nothing again.
  absl::StatusOr<CommitResult> Commit(const std::string& batch_id,
                                      uint64_t policy_version);

  // Returns the groups of batches past their deadline to the front of the
  // ready queue; returns the expired batches' ids.
  std::vector<std::string> ExpireBatches(absl::Time now);
  // Expires one batch now (journal replay). False when unknown. `released`:
  // counted as released (its trainer died or left) rather than expired;
  // `handed_back`: its groups go to the back, as in Release.
  bool ExpireBatch(const std::string& batch_id, bool released = false,
                   bool handed_back = false);
  // Its holder hands the open batch `batch_id` back untrained: its groups
  // go to the back of the ready queue at once (behind the groups that
  // waited meanwhile, so that a batch whose step fails again is not the
  // next one pulled), counted as released; a late commit of it still
  // counts, as after ExpireBatches. Returns the batch's group count.
  // NotFound when no open batch has that id; PermissionDenied when it was
  // pulled by a member other than `member_id`.
  absl::StatusOr<uint32_t> Release(const std::string& batch_id,
                                   const std::string& member_id);
  // Returns the groups of every open batch whose holder (the member that
  // pulled it) satisfies `gone` to the front of the ready queue, as
  // ExpireBatches does (a late commit still counts); returns their ids.
  // Batches without a recorded holder are left to their deadline.
  template <typename Pred>
  std::vector<std::string> ReleaseBatches(Pred gone) {
    std::vector<std::string> released;
    for (auto it = batches_.begin(); it != batches_.end();) {
      auto next = std::next(it);
      if (!it->second.member_id.empty() && gone(it->second.member_id)) {
        released.push_back(it->first);
        ExpireLocked(it, /*released=*/true);
      }
      it = next;
    }
    return released;
  }
  // Moves every open batch's deadline to `deadline` (a restarted
  // coordinator gives its trainer a full batch_timeout).
  void RenewOpenBatches(absl::Time deadline);
  // Puts groups trained into versions a resuming trainer no longer holds
  // back at the front of the ready queue, keeping their order; returns
  // how many (the rest were too stale and are destroyed).
  uint32_t Requeue(std::vector<std::unique_ptr<GroupState>> groups,
                   uint64_t trainer_version);

  // Restoring from the journal: a ready group (appended as is, no staleness
  // check), a batch handed out and not committed, and an expired batch
  // whose groups were already added as ready (a late commit still counts).
  void AddRestored(std::unique_ptr<GroupState> group);
  void AddOpenBatch(const std::string& batch_id, uint64_t trainer_version,
                    absl::Time deadline,
                    std::vector<std::unique_ptr<GroupState>> groups,
                    const std::string& member_id = "");
  void AddExpiredBatch(const std::string& batch_id, uint64_t trainer_version,
                       std::vector<std::string> group_ids);
  // Records that rebuild the queue: open and expired batches and ready
  // groups.
  void AppendSnapshot(std::vector<journal::Record>* records) const;
  TrainingQueueCounters& mutable_counters() { return counters_; }

  uint64_t ready_groups() const { return ready_.size(); }
  uint64_t training_groups() const { return training_groups_; }
  const TrainingQueueCounters& counters() const { return counters_; }

 private:
  struct Batch {
    std::vector<std::unique_ptr<GroupState>> groups;
    uint64_t trainer_version = 0;
    absl::Time deadline;
    // The trainer member that pulled it (empty: unknown, an old journal).
    std::string member_id;
  };
  struct ExpiredBatch {
    std::vector<std::string> group_ids;
    uint64_t trainer_version = 0;
  };

  bool TooStale(const GroupState& group, uint64_t version) const;
  // Counts `dropped` groups as dropped stale and hands their prompts to
  // retry_prompts_, in their order, ahead of what was pending.
  void Retry(std::vector<std::unique_ptr<GroupState>> dropped);
  // Returns the batch's groups to the ready queue: to the front, or to the
  // back when `handed_back` (its trainer refused to train it).
  void ExpireLocked(std::map<std::string, Batch>::iterator it,
                    bool released = false, bool handed_back = false);
  void Remember(std::map<std::string, uint32_t>* done,
                std::deque<std::string>* order, const std::string& batch_id,
                uint32_t count);

  const TrainingQueueOptions options_;
  std::deque<std::shared_ptr<const Prompt>>* const retry_prompts_;
  std::deque<std::unique_ptr<GroupState>> ready_;
  std::map<std::string, Batch> batches_;
  uint64_t training_groups_ = 0;
  // Recently expired and committed batches, for late and repeated commits
  // (bounded).
  std::map<std::string, ExpiredBatch> expired_;
  std::deque<std::string> expired_order_;
  std::map<std::string, uint32_t> committed_;
  std::deque<std::string> committed_order_;
  uint64_t dropped_since_pull_ = 0;
  TrainingQueueCounters counters_;
};

}  // namespace tandem::coordinator
