#pragma once

// GroupLedger is the coordinator's record of where every prompt and sample
// is: prompts pending (returned ones first, then the source), leased to a
// rollout worker, samples waiting for scores, and (via its TrainingQueue)
// ready and training groups. It never loses or duplicates a prompt:
//
//   pending --Lease--> leased --all samples submitted--> scoring
//      ^                 |                                  |
//      +-- expiry, return, member death                all scored
//                                                           v
//               trained <--Commit-- training <--Pull-- ready (TrainingQueue)
//
// A lease covers one prompt and one group of group_size samples; a prompt
// whose lease ends unfinished (expired, returned, its worker dead or gone)
// goes back to the front of the pending queue and is leased again under a
// new lease and group id; samples of the old lease are then rejected, and
// scores that arrive for it are ignored.
//
// Dispatch throttle (staleness bound): no leases to a worker more than
// max_lag versions behind the latest published version, nor while at least
// max(max_lag - lag, 1) * groups_per_version groups are in flight (leased,
// scoring, ready or training), where lag is how far the asking worker is
// behind: its group is trained after those ahead of it, about in_flight /
// groups_per_version versions from now, and its tokens are already lag
// versions old. A group that goes stale all the same is dropped and its
// prompt leased again (TrainingQueue). groups_per_version starts at the
// configured value and follows the trainer's batch size (max_groups of its
// last pull), so work dispatched now is trained within max_lag versions
// instead of being generated only to be dropped as stale.
//
// Durability: with a Journal (Recover()), every change is appended as a
// record, and the journal is synced at batch boundaries (a batch handed
// out, committed or published) and by SyncJournal(); a restarted
// coordinator replays it and continues with the same prompts, groups,
// batches and version. See journal.h.
//
// Publish protocol (trainer <-> coordinator; docs/architecture.md):
//
//   The trainer and the coordinator agree on a version v. The trainer
//   pulls batch B (the Pulled record is synced before the answer leaves,
//   so a batch the trainer holds is never forgotten), steps to v+1, and
//   calls PublishPolicyVersion(v+1, batch_id B) until it gets an answer
//   that is not a transport error. PublishTrainedVersion commits B and
//   advances the version in ONE journal record, synced before OK:
//     - version == current + 1 and B open (or released/expired with all
//       of its groups still ready, a late commit): commit + publish, OK;
//     - version == current and B is the batch of the current version: the
//       same publish again (its answer was lost), OK, nothing changes;
//     - anything else: FAILED_PRECONDITION (B unknown, already committed
//       into another version, or handed out again; or a version that does
//       not follow). The trainer then adopts the coordinator's numbering
//       (ResumeTraining) and publishes its weights without a batch.
//   Crash points:
//     coordinator dies before the Pulled sync: the trainer got no batch.
//     coordinator dies with B open (trainer stepping or retrying): the
//       journal restores B open, its deadline renewed; the retried publish
//       commits it. If the trainer re-registered under a new id, B is
//       released after the grace period and the retry late-commits it.
//     coordinator dies after the Published sync, before answering: the
//       retry is a duplicate, OK.
//     trainer dies holding B: B is released when the trainer member is
//       declared dead or leaves (ReleaseBatches), not at batch_timeout.
//     trainer dies after the publish, before its checkpoint: the new
//       trainer calls ResumeTraining(checkpoint version s): the groups of
//       versions after s go back to the ready queue while within max_lag
//       (trained again) and are counted lost otherwise (Resume).
//   A trainer checkpoints only acknowledged versions, so a checkpoint
//   never holds a step the coordinator may not have recorded.
//
// Time is passed in (`now`), so tests drive it. Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/coordinator/group_state.h"
#include "services/coordinator/journal.h"
#include "services/coordinator/prompt_source.h"
#include "services/coordinator/trained_history.h"
#include "services/coordinator/training_queue.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/verifier.pb.h"

namespace tandem::coordinator {

// Bounds on the source prompts a lease with excluded environments skips
// (GroupLedger::Lease).
inline constexpr size_t kMaxSkippedPerLease = 256;
inline constexpr size_t kMaxSkippedPending = 4096;

struct GroupLedgerOptions {
  uint32_t group_size = 8;
  uint32_t max_lag = 4;
  absl::Duration lease_timeout = absl::Minutes(1);
  absl::Duration batch_timeout = absl::Minutes(5);
  bool keep_stale = false;
  uint64_t groups_per_version = 16;
  // Sent with every lease (stop_token_ids and max_tokens may be filled from
  // the prompt source).
  tandem::v1::SamplingParams sampling;
  // Makes lease, group and batch ids unique across coordinator restarts.
  std::string id_prefix = "c0";
  // How long a worker should wait when no lease can be given.
  absl::Duration throttle_retry = absl::Milliseconds(200);
  absl::Duration empty_retry = absl::Seconds(1);
};

// A sample to be scored, with where its score goes.
struct ScoringTask {
  std::string group_id;
  uint32_t sample_index = 0;
  tandem::v1::ScoreItem item;  // item_id is the sample_id
};

struct SubmitResult {
  tandem::v1::SubmitSamplesResponse response;
  // Newly accepted samples to score.
  std::vector<ScoringTask> to_score;
};

struct RenewResult {
  uint32_t renewed = 0;
  std::vector<std::string> unknown;
  absl::Time deadline;
};

// Plain figures for status and metrics.
struct LedgerStats {
  uint64_t policy_version = 0;
  uint64_t pending_prompts = 0;
  uint64_t leased_prompts = 0;
  uint64_t scoring_samples = 0;
  uint64_t ready_groups = 0;
  uint64_t training_groups = 0;
  uint64_t groups_dispatched = 0;
  uint64_t groups_completed = 0;
  uint64_t groups_trained = 0;
  uint64_t groups_dropped_stale = 0;
  uint64_t groups_kept_stale = 0;
  uint64_t groups_abandoned = 0;  // leases that ended unfinished
  uint64_t samples_received = 0;
  uint64_t lease_expiries = 0;
  uint64_t batches_expired = 0;
  uint64_t batches_released = 0;   // their trainer died or left
  uint64_t groups_requeued = 0;    // a trainer resumed from before them
  uint64_t groups_lost = 0;        // the same, too stale to train again
  uint64_t dataset_cursor = 0;
  uint64_t journal_bytes = 0;
  uint64_t journal_syncs = 0;
  double journal_sync_seconds = 0;
  bool dataset_exhausted = false;
};

struct PublishResult {
  // The (batch, version) was already recorded: nothing changed.
  bool duplicate = false;
  // What the publish committed (empty without a batch or when duplicate).
  CommitResult commit;
};

struct ResumeResult {
  uint64_t policy_version = 0;
  uint32_t groups_requeued = 0;
  uint32_t groups_lost = 0;
  uint32_t batches_released = 0;
  // False when the versions rewound reach beyond what the ledger remembers
  // (groups_lost is then a lower bound).
  bool complete = true;
};

class GroupLedger {
 public:
  GroupLedger(GroupLedgerOptions options, std::unique_ptr<PromptSource> source);

  // Leases up to `max_prompts` prompts to `member_id`, whose weights are at
  // `worker_version`. Prompts whose environment is in `excluded` are
  // skipped and stay queued in their order, ahead of the prompts not yet
  // read from the source (a prompt read from the source and skipped joins
  // the pending prompts, journaled as such, so that recovery finds it
  // there). A lease skips at most kMaxSkippedPerLease source prompts, and
  // none while kMaxSkippedPending prompts are pending: a filtered lease of
  // a dataset of excluded tasks does not read the whole dataset.
  tandem::v1::LeasePromptsResponse Lease(
      const std::string& member_id, uint32_t max_prompts,
      uint64_t worker_version, absl::Time now,
      const std::vector<std::string>& excluded = {});
  // Extends the member's leases (all of them when `lease_ids` is empty).
  // Leases that do not exist or belong to another member are `unknown`.
  RenewResult Renew(const std::string& member_id,
                    const std::vector<std::string>& lease_ids, absl::Time now);
  // Gives the member's listed leases back; returns how many were returned.
  uint32_t Return(const std::string& member_id,
                  const std::vector<std::string>& lease_ids);
  // Returns every lease of a member that died or left.
  uint32_t ReleaseMember(const std::string& member_id);
  // Returns leases past their deadline; returns how many.
  uint32_t ExpireLeases(absl::Time now);

  // Accepts samples of live leases (idempotent by sample_id); samples of
  // unknown or expired leases, or naming another group or an index beyond
  // group_size, are listed in rejected_sample_ids. Before accepting any,
  // checks every sample of a live lease (sample_validation.h): the lease
  // is held by one of `holders` (by the request's member_id when empty),
  // else PermissionDenied; every span's version is within [the lease's
  // dispatch version - max_lag, published version + kVersionsAheadAllowed],
  // else InvalidArgument. A refused call changes nothing. The checks that
  // need no state (ValidateSubmitRequest) are the caller's.
  absl::StatusOr<SubmitResult> Submit(
      const tandem::v1::SubmitSamplesRequest& request,
      const std::vector<std::string>& holders = {});
  // Records a verifier's score; ignored when the group is gone or the
  // sample already has one. Returns true when the group became ready.
  bool RecordScore(const std::string& group_id, uint32_t sample_index,
                   const tandem::v1::Score& score);

  tandem::v1::PullTrainingBatchResponse Pull(
      const tandem::v1::PullTrainingBatchRequest& request, absl::Time now);
  absl::StatusOr<CommitResult> Commit(const std::string& batch_id,
                                      uint64_t policy_version);
  uint32_t ExpireBatches(absl::Time now);

  // Versions go up by one: FailedPrecondition unless the manifest's
  // version is the current version plus one.
  absl::Status PublishVersion(const tandem::v1::WeightManifest& manifest,
                              const std::string& weight_server_address);
  // The publish protocol above: publishes the manifest's version and, with
  // a non-empty `batch_id`, commits that batch into it atomically and
  // idempotently. The journal is synced before it returns OK.
  absl::StatusOr<PublishResult> PublishTrainedVersion(
      const tandem::v1::WeightManifest& manifest,
      const std::string& weight_server_address, const std::string& batch_id);
  // A trainer (`member_id`) resumes with weights at `trainer_version`:
  // releases the open batches of every other holder, and when
  // trainer_version is behind the latest version, forgets what the later
  // versions trained: groups still within max_lag of the latest version go
  // back to the front of the ready queue, the rest are counted lost.
  // Journaled and synced.
  absl::StatusOr<ResumeResult> Resume(const std::string& member_id,
                                      uint64_t trainer_version);
  // The trainer `member_id` hands back the open batch `batch_id` untrained:
  // its groups go to the back of the ready queue at once (journaled as a
  // release), still subject to max_lag; returns how many. NotFound /
  // PermissionDenied as TrainingQueue::Release.
  absl::StatusOr<uint32_t> ReleaseBatch(const std::string& member_id,
                                        const std::string& batch_id);
  // Returns the open batches whose holder satisfies `gone` (a dead or
  // departed trainer member) to the front of the ready queue at once;
  // returns how many.
  uint32_t ReleaseBatches(const std::function<bool(const std::string&)>& gone);
  // The same with an empty manifest (tests).
  absl::Status PublishVersion(uint64_t version);
  uint64_t policy_version() const;
  // The latest published manifest (version 0 and empty before any) and
  // its weight server address.
  void LatestVersion(tandem::v1::WeightManifest* manifest,
                     std::string* weight_server_address) const;

  // Replays `journal` into this (fresh) ledger, renews the restored leases
  // until now + lease_timeout, compacts the journal, and from then on
  // records every change in it. `to_score` receives the restored samples
  // that still need a score. Errors name the journal and offset.
  absl::Status Recover(std::unique_ptr<Journal> journal, absl::Time now,
                       std::vector<ScoringTask>* to_score);
  // The journal (null without one); outlives every call on the ledger.
  Journal* journal() const;
  // Writes buffered journal records to the file (no fsync).
  absl::Status FlushJournal();
  // Writes and fsyncs them.
  absl::Status SyncJournal();
  // Compacts the journal when it has grown past `max_bytes`.
  absl::Status MaybeCompactJournal(uint64_t max_bytes);
  uint64_t journal_bytes() const;

  LedgerStats Stats() const;
  // Live leases by member id; members holding none are absent.
  std::map<std::string, uint32_t> LeasesByMember() const;
  std::string DescribeSource() const;

 private:
  std::unique_ptr<GroupState> NewGroup(std::shared_ptr<const Prompt> prompt,
                                       const std::string& member_id,
                                       uint64_t worker_version, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a lease unfinished: the prompt goes back to the front of pending.
  void AbandonLocked(const std::string& group_id, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next source prompt not excluded; the excluded ones read on the way
  // join pending_ (journaled). Null when the source is exhausted or the
  // skip bounds are reached; `skipped` counts this lease's skips.
  std::shared_ptr<const Prompt> NextFromSourceLocked(
      const std::vector<std::string>& excluded, size_t* skipped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Installs a dispatched group in the lease tables.
  void InsertLeasedLocked(std::unique_ptr<GroupState> group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submit's checks that need the ledger's state (lease holder, version
  // range); changes nothing.
  absl::Status CheckSubmitLocked(
      const tandem::v1::SubmitSamplesRequest& request,
      const std::vector<std::string>& holders) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores one valid new sample; returns its scoring task.
  ScoringTask AcceptSampleLocked(GroupState& group,
                                 const tandem::v1::Sample& sample,
                                 const std::string& member_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RecordScoreLocked(const std::string& group_id, uint32_t sample_index,
                         const tandem::v1::Score& score)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PublishLocked(const tandem::v1::WeightManifest& manifest,
                             const std::string& weight_server_address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `batch_id` (when not empty) and publishes, as one change
  // (journaled as one Published record when `journal`).
  absl::StatusOr<CommitResult> CommitAndPublishLocked(
      const tandem::v1::WeightManifest& manifest,
      const std::string& weight_server_address, const std::string& batch_id,
      bool journal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Journals and applies a release of `batch_ids` (their holder is gone).
  void ReleaseLocked(const std::vector<std::string>& batch_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets what versions after `version` trained (Resume, replay).
  ResumeResult RewindLocked(uint64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `record` to the journal (if any); returns its log position for
  // Journal::SyncTo, which callers call after releasing mu_.
  uint64_t Record(const journal::Record& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one journal record (replay).
  absl::Status ApplyLocked(const journal::Record& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that rebuild the current state.
  std::vector<journal::Record> SnapshotLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeReadyLocked(const std::string& group_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberFinishedLease(const std::string& lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupLedgerOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<PromptSource> source_ ABSL_GUARDED_BY(mu_);
  bool source_exhausted_ ABSL_GUARDED_BY(mu_) = false;
  // Prompts returned unfinished or whose group was dropped as stale (by
  // training_), leased before new ones.
  std::deque<std::shared_ptr<const Prompt>> pending_ ABSL_GUARDED_BY(mu_);
  // Groups that are leased or scoring, by group id.
  absl::flat_hash_map<std::string, std::unique_ptr<GroupState>> groups_
      ABSL_GUARDED_BY(mu_);
  // Live leases: lease id -> group id, and member -> lease ids.
  absl::flat_hash_map<std::string, std::string> leases_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> member_leases_
      ABSL_GUARDED_BY(mu_);
  // Leases whose samples were all submitted (bounded), so resubmissions
  // count as duplicates rather than rejections.
  absl::flat_hash_set<std::string> finished_leases_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_order_ ABSL_GUARDED_BY(mu_);
  TrainingQueue training_ ABSL_GUARDED_BY(mu_);
  uint64_t policy_version_ ABSL_GUARDED_BY(mu_) = 0;
  // The batch committed by the latest version's publish (duplicates).
  std::string last_batch_id_ ABSL_GUARDED_BY(mu_);
  TrainedHistory history_ ABSL_GUARDED_BY(mu_);
  tandem::v1::WeightManifest manifest_ ABSL_GUARDED_BY(mu_);
  std::string weight_server_address_ ABSL_GUARDED_BY(mu_);
  // Null when the coordinator runs without a journal. Set once by
  // Recover() before the ledger serves; the Journal is thread-safe, so
  // callers sync through the pointer after releasing mu_ (group commit:
  // no lease or submit waits for the disk).
  std::unique_ptr<Journal> journal_ ABSL_GUARDED_BY(mu_);
  uint64_t groups_per_version_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t scoring_samples_ ABSL_GUARDED_BY(mu_) = 0;
  LedgerStats counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator
