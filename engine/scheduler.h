#pragma once

// Scheduler decides, before every engine step, which tokens of which
// sequences are computed: one token for each running sequence that is
// decoding, chunks of prompt for sequences being prefilled, and new
// admissions from the waiting queue as soon as KV-cache blocks and the
// token budget allow (continuous batching). When the cache is full it
// preempts the most recently admitted sequence: its blocks are freed and it
// returns to the front of the queue to be recomputed later; nothing is
// dropped. Not thread-safe: the engine thread owns it.
//
// Parked sequences (multi-turn episodes waiting for their environment) take
// no batch slot and keep their KV blocks, so a resumed turn prefills only
// the environment's tokens. Under memory pressure their blocks go first:
// before a running sequence is preempted, the longest-parked sequence's
// cache is dropped (it is recomputed, prompt and every turn, when it
// resumes); admissions reclaim parked caches only when nothing runs.
// Resumed sequences re-enter the batch, ahead of new admissions, as soon as
// a slot is free (never while admission is kNone, a drain for an update).

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace tandem::engine {

struct SchedulerLimits {
  int32_t max_num_seqs = 64;
  int32_t max_batched_tokens = 4096;
};

// Compute tokens [start, end) of `seq` (prompt then output). When end ==
// seq->total_len() the step yields logits to sample the next token from.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t start = 0;
  int32_t end = 0;
  bool samples() const { return end == seq->total_len(); }
};

struct SchedulePlan {
  std::vector<ScheduledChunk> chunks;
  // Sequences preempted in this plan (their caches must be dropped).
  std::vector<Sequence*> preempted;
  // Sequences newly admitted in this plan.
  int32_t admitted = 0;
};

class Scheduler {
 public:
  // Admission gate: static batching admits only into an empty batch; a
  // pending drain admits nothing.
  enum class Admission { kContinuous, kStatic, kNone };

  Scheduler(SchedulerLimits limits, BlockManager* blocks);

  void AddWaiting(Sequence* seq);
  // Queues ahead of everything waiting (siblings ready to share a cache).
  void AddWaitingFront(Sequence* seq);
  // Forgets every sequence; blocks are freed.
  void Clear();
  // Plans one step. `fork_ready(seq)` is asked for waiting siblings that can
  // copy a leader's prompt cache instead of prefilling; it returns the
  // number of cached tokens it provided (0 = prefill normally).
  SchedulePlan Schedule(Admission admission,
                        const std::function<int32_t(Sequence*)>& fork_ready);
  // Removes a finished sequence from the running set and frees its blocks.
  void Finish(Sequence* seq);
  // Forgets a waiting or running sequence (an abort) and frees its blocks.
  void Remove(Sequence* seq);
  // Moves every running sequence back to the waiting queue front with its
  // cache dropped (kv_policy recompute after a weight update); parked
  // sequences drop their caches too. Returns every sequence whose cache
  // was dropped.
  std::vector<Sequence*> RecomputeAll();
  // Takes a running or waiting sequence out of the batch, keeping its
  // blocks (status kParked).
  void Park(Sequence* seq);
  // Marks a parked sequence ready to continue; it re-enters the batch at a
  // coming Schedule.
  void Resume(Sequence* seq);

  const std::vector<Sequence*>& running() const { return running_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_parked() const { return parked_.size(); }
  // Nothing to compute: no running, waiting or resumed sequence (parked
  // sequences waiting for their environment do not count).
  bool idle() const {
    return running_.empty() && waiting_.empty() && num_resumed_ == 0;
  }

 private:
  void Preempt(Sequence* seq, SchedulePlan* plan);
  // Drops the cache of the longest-parked sequence that holds blocks.
  // Returns false when none does.
  bool EvictParked(SchedulePlan* plan);
  void DropParked(Sequence* seq);

  const SchedulerLimits limits_;
  BlockManager* const blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  std::vector<Sequence*> parked_;   // in parking order
  int32_t num_resumed_ = 0;         // parked_ entries with resume_ready
  uint64_t next_admission_ = 1;
};

}  // namespace tandem::engine
