#pragma once

// PromptPrefetcher keeps a local queue of leased prompts full from the
// coordinator on a background thread, so the engine never waits on the
// network for work (the Olmo 3 lesson). Leases it holds but the engine has
// not started are returned to the coordinator by ReturnQueued(). Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/cluster/coordinator_client.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::rollout {

class PromptPrefetcher {
 public:
  // `coordinator` (not owned) must outlive the prefetcher. `member_id`
  // returns the worker's current member id ("" while unregistered);
  // `policy_version` its live version.
  PromptPrefetcher(cluster::CoordinatorClient* coordinator,
                   std::function<std::string()> member_id,
                   std::function<uint64_t()> policy_version,
                   int32_t target_depth, Clock* clock = RealClock());
  ~PromptPrefetcher();

  void Start();
  // Stops the thread (joins). Idempotent.
  void Stop();
  // Stops or resumes leasing (draining stops it; queued leases stay).
  void SetLeasing(bool enabled);
  // Leases nothing for `duration` (a worker that had to refuse a lease, so
  // that it does not lease and return the same prompts in a tight loop).
  void Backoff(absl::Duration duration);

  // Leases of tasks of `environment` ("" none) are neither taken nor
  // leased until this is called again: Take() passes over the queued ones
  // (they stay queued, in order), they do not count towards the queue's
  // depth, and lease requests ask the coordinator to skip such tasks (a
  // worker at its limit of harness episodes, openai.harness_max_episodes).
  void SetExcludedEnvironment(std::string environment);

  // Up to `n` queued leases, oldest first, but for the excluded ones;
  // never blocks.
  std::vector<tandem::v1::PromptLease> Take(int32_t n);
  // Gives every queued lease back to the coordinator; returns how many.
  int32_t ReturnQueued(const std::string& reason);
  // Returns specific leases (e.g. aborted in-flight work).
  void Return(const std::vector<std::string>& lease_ids,
              const std::string& reason);

  int32_t depth() const;
  uint64_t leased_total() const;

 private:
  void Run();

  cluster::CoordinatorClient* const coordinator_;
  const std::function<std::string()> member_id_;
  const std::function<uint64_t()> policy_version_;
  const int32_t target_depth_;
  // Times Backoff and the waits between lease calls (not the calls' gRPC
  // deadlines). Outlives the prefetcher.
  Clock* const clock_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<tandem::v1::PromptLease> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool leasing_ ABSL_GUARDED_BY(mu_) = true;
  std::string excluded_ ABSL_GUARDED_BY(mu_);
  // On clock_.
  absl::Time backoff_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t leased_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::rollout
