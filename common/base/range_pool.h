#pragma once

// A pool of threads for short, frequent parallel loops: Run(n, fn) calls
// fn(0) ... fn(n - 1) at once, fn(n - 1) on the calling thread and the
// others on threads that live as long as the pool, and returns when all
// have returned.
//
// Why not a std::thread per call: a decode step of a 24-layer model runs
// about 170 projections, each split over the cores; starting and joining a
// thread for each costs tens of microseconds, a share of a small step that
// the pool's wake-up (a futex) does not cost (tests/bench/row_gemm_bench.cc,
// paths "pool" and "spawn"). Why not LibTorch's at::parallel_for: compiled
// into our code without -fopenmp it runs every range on the calling thread
// (common/model/layers.cc).
//
// Thread safety: Run may be called from any thread. One Run uses the
// helpers at a time; a Run that finds them busy runs all of its indices on
// its own thread instead of waiting (same results, no parallelism), so two
// callers never block each other. fn must not call Run of the same pool.

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class RangePool {
 public:
  // Starts `helpers` threads (0: Run always runs on the caller).
  explicit RangePool(int helpers);
  // Stops and joins every helper. REQUIRES: no Run in progress.
  ~RangePool();

  RangePool(const RangePool&) = delete;
  RangePool& operator=(const RangePool&) = delete;

  // The most indices a Run spreads over threads: helpers() + 1.
  int max_parallel() const { return static_cast<int>(threads_.size()) + 1; }

  // Calls fn(i) for every i in [0, n), each exactly once, and returns after
  // the last. Indices n - 1 and every index at or above max_parallel() - 1
  // run on the calling thread. REQUIRES: n >= 0.
  void Run(int n, absl::FunctionRef<void(int)> fn);

  // A process-wide pool with one helper per hardware thread but one,
  // started on first use and joined at exit.
  static RangePool& Shared();

 private:
  void Helper(int index);

  // Held by the Run that is using the helpers.
  absl::Mutex run_mu_;
  absl::Mutex mu_;
  // Bumped by each Run that hands out work; a helper works once per bump.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The work of the current generation: helper i runs fn_(i) if i < n_.
  int n_ ABSL_GUARDED_BY(mu_) = 0;
  const absl::FunctionRef<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Helpers of the current generation that have not finished.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem
