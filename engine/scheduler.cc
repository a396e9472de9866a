#include "engine/scheduler.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace tandem::engine {

Scheduler::Scheduler(SchedulerLimits limits, BlockManager* blocks)
    : limits_(limits), blocks_(blocks) {}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::AddWaitingFront(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_front(seq);
}

void Scheduler::Clear() {
  for (Sequence* seq : running_) blocks_->Release(&seq->blocks);
  for (Sequence* seq : waiting_) blocks_->Release(&seq->blocks);
  for (Sequence* seq : parked_) blocks_->Release(&seq->blocks);
  running_.clear();
  waiting_.clear();
  parked_.clear();
  num_resumed_ = 0;
}

void Scheduler::Park(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  seq->status = SequenceStatus::kParked;
  seq->resume_ready = false;
  parked_.push_back(seq);
}

void Scheduler::Resume(Sequence* seq) {
  if (seq->status != SequenceStatus::kParked || seq->resume_ready) return;
  seq->resume_ready = true;
  ++num_resumed_;
}

void Scheduler::DropParked(Sequence* seq) {
  auto it = std::find(parked_.begin(), parked_.end(), seq);
  if (it == parked_.end()) return;
  parked_.erase(it);
  if (seq->resume_ready) --num_resumed_;
  seq->resume_ready = false;
}

bool Scheduler::EvictParked(SchedulePlan* plan) {
  for (Sequence* seq : parked_) {
    if (seq->blocks.empty()) continue;
    blocks_->Release(&seq->blocks);
    seq->num_cached = 0;
    ++seq->preemptions;
    plan->preempted.push_back(seq);
    return true;
  }
  return false;
}

void Scheduler::Preempt(Sequence* seq, SchedulePlan* plan) {
  blocks_->Release(&seq->blocks);
  seq->num_cached = 0;
  seq->status = SequenceStatus::kWaiting;
  ++seq->preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  plan->preempted.push_back(seq);
}

SchedulePlan Scheduler::Schedule(
    Admission admission, const std::function<int32_t(Sequence*)>& fork_ready) {
  SchedulePlan plan;
  int32_t budget = limits_.max_batched_tokens;

  // 0. Resumed turns re-enter the batch first: they hold (or held) a cache
  //    and finishing their episodes frees it. Step 1 computes their
  //    environment tokens like any running sequence's pending tokens.
  if (admission != Admission::kNone) {
    for (auto it = parked_.begin();
         num_resumed_ > 0 && it != parked_.end() &&
         static_cast<int32_t>(running_.size()) < limits_.max_num_seqs;) {
      Sequence* seq = *it;
      if (!seq->resume_ready) {
        ++it;
        continue;
      }
      it = parked_.erase(it);
      --num_resumed_;
      seq->resume_ready = false;
      seq->status = SequenceStatus::kRunning;
      seq->admitted_seq = next_admission_++;
      running_.push_back(seq);
    }
  }

  // 1. Running sequences, oldest first. Each needs cache slots for what it
  //    computes now; if blocks run out, the newest running sequence is
  //    preempted until the older one fits (or it was the newest itself).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int32_t remaining = seq->total_len() - seq->num_cached;
    const int32_t end = seq->num_cached + std::min(remaining, budget);
    bool preempted_self = false;
    while (!blocks_->EnsureCapacity(&seq->blocks, end)) {
      if (EvictParked(&plan)) continue;
      Sequence* victim = running_.back();
      Preempt(victim, &plan);
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;  // running_[i] is now the next sequence
    plan.chunks.push_back({seq, seq->num_cached, end});
    budget -= end - seq->num_cached;
    ++i;
  }

  // 2. Admissions.
  const bool may_admit = admission == Admission::kContinuous ||
                         (admission == Admission::kStatic && running_.empty());
  while (may_admit && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < limits_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // Reserve blocks for the whole known sequence so admission never
    // oversubscribes the cache; decode growth is handled in step 1.
    if (!blocks_->EnsureCapacity(&seq->blocks, seq->total_len())) {
      if (running_.empty() && EvictParked(&plan)) continue;
      break;
    }
    waiting_.pop_front();
    seq->status = SequenceStatus::kRunning;
    seq->admitted_seq = next_admission_++;
    if (seq->admitted == absl::Time()) seq->admitted = absl::Now();
    running_.push_back(seq);
    ++plan.admitted;
    if (seq->num_cached == 0 && fork_ready) {
      seq->num_cached = fork_ready(seq);
    }
    const int32_t remaining = seq->total_len() - seq->num_cached;
    const int32_t end = seq->num_cached + std::min(remaining, budget);
    plan.chunks.push_back({seq, seq->num_cached, end});
    budget -= end - seq->num_cached;
  }
  return plan;
}

void Scheduler::Finish(Sequence* seq) {
  blocks_->Release(&seq->blocks);
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
  DropParked(seq);
  seq->status = SequenceStatus::kFinished;
}

void Scheduler::Remove(Sequence* seq) {
  auto it = std::find(waiting_.begin(), waiting_.end(), seq);
  if (it != waiting_.end()) waiting_.erase(it);
  Finish(seq);
}

std::vector<Sequence*> Scheduler::RecomputeAll() {
  std::vector<Sequence*> dropped(running_.begin(), running_.end());
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* seq = *it;
    blocks_->Release(&seq->blocks);
    seq->num_cached = 0;
    seq->status = SequenceStatus::kWaiting;
    waiting_.push_front(seq);
  }
  running_.clear();
  for (Sequence* seq : parked_) {
    if (seq->blocks.empty() && seq->num_cached == 0) continue;
    blocks_->Release(&seq->blocks);
    seq->num_cached = 0;
    dropped.push_back(seq);
  }
  return dropped;
}

}  // namespace tandem::engine
