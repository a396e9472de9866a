// common/base/range_pool.h: every index runs exactly once, on the pool's
// threads as well as the caller's; a Run that finds the helpers busy runs
// on its own thread instead of waiting; the pool joins its threads.

#include <catch2/catch.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/base/range_pool.h"

namespace tandem {
namespace {

TEST_CASE("RangePool runs every index once, spread over its threads",
          "[range_pool]") {
  RangePool pool(3);
  REQUIRE(pool.max_parallel() == 4);
  for (int n : {0, 1, 2, 4, 7}) {
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> calls(static_cast<size_t>(n));
      absl::Mutex mu;
      std::set<std::thread::id> threads;
      pool.Run(n, [&](int i) {
        calls[static_cast<size_t>(i)].fetch_add(1);
        absl::MutexLock lock(&mu);
        threads.insert(std::this_thread::get_id());
      });
      for (int i = 0; i < n; ++i) {
        INFO("n " << n << " round " << round << " index " << i);
        REQUIRE(calls[static_cast<size_t>(i)].load() == 1);
      }
      // One thread per index up to max_parallel (the caller's among them).
      const size_t expected = static_cast<size_t>(std::min(n, 4));
      INFO("n " << n << " round " << round);
      REQUIRE(threads.size() == expected);
    }
  }
}

TEST_CASE("RangePool: the last index runs on the calling thread",
          "[range_pool]") {
  RangePool pool(1);
  std::thread::id ran_last, ran_first;
  pool.Run(2, [&](int i) {
    (i == 1 ? ran_last : ran_first) = std::this_thread::get_id();
  });
  CHECK(ran_last == std::this_thread::get_id());
  CHECK(ran_first != std::this_thread::get_id());
}

TEST_CASE("RangePool without helpers runs everything on the caller",
          "[range_pool]") {
  RangePool pool(0);
  REQUIRE(pool.max_parallel() == 1);
  std::vector<int> order;
  pool.Run(3, [&](int i) {
    order.push_back(i);
  });
  CHECK(order == std::vector<int>{0, 1, 2});
}

TEST_CASE("RangePool: a second caller runs on its own thread, not waiting",
          "[range_pool]") {
  RangePool pool(1);
  absl::Notification first_started, second_done;
  std::thread first([&] {
    pool.Run(2, [&](int i) {
      if (i != 0) return;  // the helper's index holds the pool busy
      first_started.Notify();
      second_done.WaitForNotification();
    });
  });
  first_started.WaitForNotification();
  // The helper is busy with the first Run: this one must not wait for it
  // (it would wait forever: the first Run ends only after this one).
  std::set<std::thread::id> threads;
  pool.Run(2, [&](int) { threads.insert(std::this_thread::get_id()); });
  CHECK(threads == std::set<std::thread::id>{std::this_thread::get_id()});
  second_done.Notify();
  first.join();
}

TEST_CASE("RangePool: many callers at once, every index once",
          "[range_pool]") {
  RangePool pool(2);
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 300; ++round) {
        pool.Run(5, [&](int i) { sum.fetch_add(i + 1); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(sum.load() == 4L * 300 * (1 + 2 + 3 + 4 + 5));
}

TEST_CASE("RangePool::Shared has one thread per hardware thread",
          "[range_pool]") {
  const int hardware =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  CHECK(RangePool::Shared().max_parallel() == hardware);
  CHECK(&RangePool::Shared() == &RangePool::Shared());
}

}  // namespace
}  // namespace tandem
