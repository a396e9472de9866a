// A Clock that tests move by hand (common/base/clock.h): Now() stands
// still until Advance(), and Advance() wakes every SleepFor and
// AwaitWithDeadline whose deadline it passed, so a test of a timeout,
// backoff or expiry advances time instead of sleeping through it.
// SteppingClock, below, is the one for code that waits on one thread only.
// Thread-safe.
#ifndef TANDEM_TESTS_SUPPORT_FAKE_CLOCK_H_
#define TANDEM_TESTS_SUPPORT_FAKE_CLOCK_H_

#include <algorithm>
#include <atomic>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace tandem::testing {

class FakeClock final : public Clock {
 public:
  // Starts at `start` (an arbitrary fixed time: nothing depends on the
  // real date).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(2'000'000'000))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  void SleepFor(absl::Duration duration) const override {
    absl::MutexLock lock(&mu_);
    const absl::Time until = now_ + duration;
    const auto sleeper = sleepers_.insert(until);
    auto due = [this, until]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= until; };
    mu_.Await(absl::Condition(&due));
    sleepers_.erase(sleeper);
  }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) const override {
    Waiter waiter{deadline, mu};
    {
      absl::MutexLock lock(&mu_);
      if (now_ >= deadline)
        waiter.expired.store(true);
      else
        waiters_.insert(&waiter);
    }
    auto done = [&waiter, &condition] {
      return waiter.expired.load() || condition.Eval();
    };
    // Advance() wakes us by releasing *mu; the short real-time timeout only
    // covers the window in which Advance() could not take *mu because this
    // thread held it while starting to wait.
    while (
        !mu->AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(10))) {
    }
    {
      absl::MutexLock lock(&mu_);
      waiters_.erase(&waiter);
    }
    return condition.Eval();
  }

  // Moves time forward by `duration` (>= 0) and wakes the sleepers and
  // waiters whose deadline is now past.
  void Advance(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    now_ += duration;
    for (Waiter* waiter : waiters_) {
      if (waiter->deadline > now_ || waiter->expired.load()) continue;
      waiter->expired.store(true);
      // Releasing *mu makes absl evaluate its waiters' conditions. TryLock
      // never blocks, so this cannot deadlock with a waiter that holds *mu
      // and wants mu_; such a waiter sees `expired` itself. The waiter
      // stays registered (and *mu alive) until it takes mu_ to leave.
      if (waiter->mu->TryLock()) waiter->mu->Unlock();
    }
  }

  // Threads blocked now in SleepFor or AwaitWithDeadline on this clock
  // whose deadline has not passed (one that Advance() woke no longer
  // counts, even before its thread has run).
  int waiters() const {
    absl::MutexLock lock(&mu_);
    return WaitingLocked();
  }

  // Blocks (in real time, at most `timeout`) until at least `n` threads
  // wait on this clock; whether they do. Lets a test advance time only
  // after the code under test has started waiting for it.
  bool WaitForWaiters(int n, absl::Duration timeout = absl::Seconds(10)) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return WaitingLocked() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  struct Waiter {
    absl::Time deadline;
    absl::Mutex* mu;
    std::atomic<bool> expired{false};
  };

  int WaitingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const absl::Time until : sleepers_) n += until > now_ ? 1 : 0;
    for (const Waiter* waiter : waiters_) n += waiter->expired.load() ? 0 : 1;
    return n;
  }

  // Guards the fake time and who waits for it.
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  // Threads in SleepFor, by the time they sleep until.
  mutable std::multiset<absl::Time> sleepers_ ABSL_GUARDED_BY(mu_);
  // Threads in AwaitWithDeadline (deadline not yet passed when they came).
  mutable std::set<Waiter*> waiters_ ABSL_GUARDED_BY(mu_);
};

// A Clock for code that waits on the calling thread only (a retry loop):
// SleepFor moves time forward by its duration at once and records it, so
// the test reads the exact schedule of pauses afterwards without a second
// thread to advance time. AwaitWithDeadline returns at once too: with the
// condition true, or else at its deadline with time moved there (nothing
// else can make the condition true while this thread waits). Thread-safe,
// but two threads waiting on it would each see time jump.
class SteppingClock final : public Clock {
 public:
  explicit SteppingClock(
      absl::Time start = absl::FromUnixSeconds(2'000'000'000))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  void SleepFor(absl::Duration duration) const override {
    absl::MutexLock lock(&mu_);
    sleeps_.push_back(duration);
    if (duration > absl::ZeroDuration()) now_ += duration;
  }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) const override {
    mu->AssertHeld();
    if (condition.Eval()) return true;
    absl::MutexLock lock(&mu_);
    now_ = std::max(now_, deadline);
    return false;
  }

  // Moves time forward by `duration` (a call that takes time, say).
  void Advance(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    now_ += duration;
  }

  // Every SleepFor's duration so far, in call order.
  std::vector<absl::Duration> sleeps() const {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

// Advances `clock` by `step` and checks `done`, every 2 ms of real time,
// until `done()` returns true (then true) or `timeout` of real time has
// passed (then false). For code that waits on the clock more than once
// (a backoff, then a batch wait) or whose waits start at times the test
// cannot see.
template <typename Predicate>
bool AdvanceUntil(FakeClock& clock, absl::Duration step, Predicate done,
                  absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= give_up) return false;
    clock.Advance(step);
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// Advances `clock` by `step` whenever at least `waiting` threads wait on it
// (FakeClock::waiters), checking `done` every 1 ms of real time, until
// `done()` returns true (then true) or `timeout` of real time has passed
// (then false). Unlike AdvanceUntil, time stands still while the code
// under test is busy (a gRPC call, a computation), so a test that counts
// what happens per unit of time counts the same under load.
template <typename Predicate>
bool AdvanceWhileWaiting(FakeClock& clock, absl::Duration step, Predicate done,
                         int waiting = 1,
                         absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= give_up) return false;
    if (clock.waiters() >= waiting) clock.Advance(step);
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SUPPORT_FAKE_CLOCK_H_
