// Polling wait for tests: whether `done()` became true within `timeout`.
#ifndef TANDEM_TESTS_SUPPORT_WAIT_FOR_H_
#define TANDEM_TESTS_SUPPORT_WAIT_FOR_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::testing {

// Calls `done` every 2 ms until it returns true (then true) or `timeout`
// has passed (then false, after one last call).
template <typename Predicate>
bool WaitFor(Predicate done, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return done();
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SUPPORT_WAIT_FOR_H_
