#include "common/base/clock.h"

namespace tandem {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration duration) const override {
    if (duration > absl::ZeroDuration()) absl::SleepFor(duration);
  }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) const override {
    return mu->AwaitWithDeadline(condition, deadline);
  }
};

}  // namespace

Clock* RealClock() {
  // A function-local static of a trivially destructible-in-effect class:
  // never destroyed, so a thread may use it during process exit.
  static Clock* const clock = new RealClockImpl();
  return clock;
}

}  // namespace tandem
