#include "common/base/range_pool.h"

#include <algorithm>

namespace tandem {

RangePool::RangePool(int helpers) {
  threads_.reserve(static_cast<size_t>(std::max(helpers, 0)));
  for (int i = 0; i < helpers; ++i) {
    threads_.emplace_back([this, i] { Helper(i); });
  }
}

RangePool::~RangePool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void RangePool::Run(int n, absl::FunctionRef<void(int)> fn) {
  // Helpers take indices [0, parallel - 1); the caller takes the rest.
  const int parallel = std::min(n, max_parallel());
  if (parallel <= 1 || !run_mu_.TryLock()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = parallel - 1;
    pending_ = parallel - 1;
    ++generation_;
  }
  for (int i = parallel - 1; i < n; ++i) fn(i);
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return pending_ == 0;
    };
    mu_.Await(absl::Condition(&done));
    fn_ = nullptr;
    n_ = 0;
  }
  run_mu_.Unlock();
}

void RangePool::Helper(int index) {
  uint64_t seen = 0;
  while (true) {
    const absl::FunctionRef<void(int)>* fn = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this, &seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;
      seen = generation_;
      if (index >= n_) continue;
      fn = fn_;
    }
    (*fn)(index);
    absl::MutexLock lock(&mu_);
    --pending_;
  }
}

RangePool& RangePool::Shared() {
  static RangePool pool(
      std::max(1, static_cast<int>(std::thread::hardware_concurrency())) - 1);
  return pool;
}

}  // namespace tandem
