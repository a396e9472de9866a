// The clock seam (common/base/clock.h): the real clock's waits, and the
// fake clock that tests advance by hand (tests/support/fake_clock.h).

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "tests/support/fake_clock.h"

namespace tandem {
namespace {

using testing::FakeClock;

TEST_CASE("RealClock: Now follows absl::Now and a wait ends at its deadline",
          "[clock]") {
  Clock* clock = RealClock();
  REQUIRE(clock == RealClock());
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  CHECK(now >= before);
  CHECK(now - before < absl::Seconds(5));

  absl::Mutex mu;
  bool flag = false;
  absl::MutexLock lock(&mu);
  const absl::Time start = absl::Now();
  CHECK_FALSE(clock->AwaitWithTimeout(&mu, absl::Condition(&flag),
                                      absl::Milliseconds(20)));
  CHECK(absl::Now() - start >= absl::Milliseconds(19));
  flag = true;
  CHECK(clock->AwaitWithTimeout(&mu, absl::Condition(&flag),
                                absl::Seconds(10)));
}

TEST_CASE("FakeClock: time stands still until advanced", "[clock]") {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  CHECK(clock.Now() == t0);
  clock.Advance(absl::Seconds(90));
  CHECK(clock.Now() == t0 + absl::Seconds(90));
  clock.SleepFor(absl::ZeroDuration());  // returns at once
  CHECK(clock.waiters() == 0);
}

TEST_CASE("FakeClock: SleepFor returns only once time is advanced past it",
          "[clock]") {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Hours(1));
    woke.store(true);
  });
  REQUIRE(clock.WaitForWaiters(1));
  clock.Advance(absl::Minutes(59));
  absl::SleepFor(absl::Milliseconds(20));  // real time: it must not wake
  CHECK_FALSE(woke.load());
  clock.Advance(absl::Minutes(1));
  sleeper.join();
  CHECK(woke.load());
  CHECK(clock.waiters() == 0);
}

TEST_CASE("FakeClock: AwaitWithDeadline wakes on the condition or on Advance",
          "[clock]") {
  FakeClock clock;
  absl::Mutex mu;
  bool flag = false;  // guarded by mu

  SECTION("the deadline passes on Advance: false") {
    std::atomic<int> result{-1};
    std::thread waiter([&] {
      absl::MutexLock lock(&mu);
      result.store(clock.AwaitWithTimeout(&mu, absl::Condition(&flag),
                                          absl::Seconds(30))
                       ? 1
                       : 0);
    });
    REQUIRE(clock.WaitForWaiters(1));
    clock.Advance(absl::Seconds(29));
    absl::SleepFor(absl::Milliseconds(30));  // real time: still waiting
    CHECK(result.load() == -1);
    clock.Advance(absl::Seconds(1));
    waiter.join();
    CHECK(result.load() == 0);
  }
  SECTION("the condition becomes true first: true, no Advance needed") {
    std::atomic<int> result{-1};
    std::thread waiter([&] {
      absl::MutexLock lock(&mu);
      result.store(clock.AwaitWithTimeout(&mu, absl::Condition(&flag),
                                          absl::Seconds(30))
                       ? 1
                       : 0);
    });
    REQUIRE(clock.WaitForWaiters(1));
    {
      absl::MutexLock lock(&mu);
      flag = true;
    }
    waiter.join();
    CHECK(result.load() == 1);
  }
  SECTION("a deadline already past returns at once with the condition") {
    absl::MutexLock lock(&mu);
    CHECK_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&flag),
                                        clock.Now()));
    flag = true;
    CHECK(clock.AwaitWithDeadline(&mu, absl::Condition(&flag),
                                  clock.Now() - absl::Seconds(1)));
  }
  CHECK(clock.waiters() == 0);
}

TEST_CASE("FakeClock: one Advance wakes every waiter whose deadline passed",
          "[clock]") {
  FakeClock clock;
  absl::Mutex mu;
  bool never = false;
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 1; i <= 4; ++i) {
    threads.emplace_back([&, i] {
      absl::MutexLock lock(&mu);
      clock.AwaitWithTimeout(&mu, absl::Condition(&never), absl::Seconds(i));
      woke.fetch_add(1);
    });
  }
  REQUIRE(clock.WaitForWaiters(4));
  clock.Advance(absl::Seconds(2));  // wakes the 1 s and 2 s waiters
  for (int i = 0; i < 500 && woke.load() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  CHECK(woke.load() == 2);
  CHECK(clock.waiters() == 2);
  clock.Advance(absl::Seconds(2));
  for (std::thread& t : threads) t.join();
  CHECK(woke.load() == 4);
}

}  // namespace
}  // namespace tandem
