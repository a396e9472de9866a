#pragma once

// The clock seam: what time it is, sleeping, and waiting on a mutex with a
// deadline, behind one interface so that tests can drive time by hand
// (tests/support/fake_clock.h) instead of sleeping for a timeout to pass.
//
// Which calls go through a Clock (docs/architecture.md, "The clock seam"):
// every reading of the time that decides behaviour (a lease or heartbeat
// expiring, a backoff or retry ending, an episode's wall-time limit, an
// idle reap) and every wait for such a time. Readings that only stamp a log
// line, measure a duration for a metric, or set a gRPC/socket deadline for
// real I/O stay on absl::Now(): those are about the real world, and a fake
// clock must not stop a real RPC from timing out.
//
// A component takes a `Clock*` (constructor argument or options field)
// that defaults to RealClock() and outlives it. No globals: RealClock() is
// a stateless process-wide instance, nothing is registered anywhere.

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {

class Clock {
 public:
  virtual ~Clock() = default;

  // The time now on this clock.
  virtual absl::Time Now() const = 0;

  // Blocks the calling thread until `duration` has passed on this clock
  // (returns at once for a duration <= 0).
  virtual void SleepFor(absl::Duration duration) const = 0;

  // Like absl::Mutex::AwaitWithDeadline on this clock: `*mu` is held on
  // entry and on return; waits (with `*mu` released) until `condition`
  // holds or `deadline` has passed on this clock, and returns whether
  // `condition` holds. `condition` is evaluated with `*mu` held, as absl
  // does, whenever `*mu` is released by another thread.
  virtual bool AwaitWithDeadline(absl::Mutex* mu,
                                 const absl::Condition& condition,
                                 absl::Time deadline) const = 0;

  // AwaitWithDeadline(mu, condition, Now() + timeout).
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& condition,
                        absl::Duration timeout) const {
    return AwaitWithDeadline(mu, condition, Now() + timeout);
  }
};

// The real clock (absl::Now, absl::SleepFor, absl::Mutex deadlines).
// Stateless and thread-safe; never deleted.
Clock* RealClock();

}  // namespace tandem
