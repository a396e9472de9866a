#pragma once

// SampleSubmitter streams finished samples back to the coordinator in
// batches from a background thread, retrying while the coordinator is
// unavailable. Flush() waits (with a deadline) until everything queued was
// delivered. Thread-safe.
//
// The coordinator refuses a SubmitSamples call whole (storing nothing) when
// any one of its samples is bad (INVALID_ARGUMENT, PERMISSION_DENIED, ...).
// So that one bad sample costs only itself, the samples of a batch refused
// that way are sent again one per call; a sample refused alone is dropped,
// logged with the coordinator's reason and counted (refused_total and the
// `refused` counter), and the others are delivered.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/cluster/coordinator_client.h"
#include "prometheus/counter.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::rollout {

class SampleSubmitter {
 public:
  // `coordinator` (not owned) must outlive the submitter. `refused` (may
  // be null) counts samples the coordinator refused alone.
  SampleSubmitter(cluster::CoordinatorClient* coordinator,
                  std::function<std::string()> member_id,
                  int32_t max_batch = 64,
                  prometheus::Counter* refused = nullptr,
                  Clock* clock = RealClock());
  ~SampleSubmitter();

  void Start();
  void Enqueue(tandem::v1::Sample sample);
  // Waits until the queue is delivered or `deadline` passes; true if empty.
  bool Flush(absl::Duration deadline);
  // Samples queued or being submitted.
  size_t pending() const;
  void Stop();

  uint64_t submitted_total() const;
  // Samples not delivered: refused by the coordinator, or answered as
  // rejected (expired leases).
  uint64_t rejected_total() const;
  // Of those, samples the coordinator refused in a call of their own.
  uint64_t refused_total() const;
  // Refused calls of several samples that were then sent one by one.
  uint64_t split_total() const;

 private:
  void Run();

  cluster::CoordinatorClient* const coordinator_;
  const std::function<std::string()> member_id_;
  const int32_t max_batch_;
  prometheus::Counter* const refused_counter_;
  // Times the retry backoff after UNAVAILABLE (not the calls' deadlines).
  Clock* const clock_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<tandem::v1::Sample> queue_ ABSL_GUARDED_BY(mu_);
  // Samples of a refused call, each sent again alone (before queue_).
  std::deque<tandem::v1::Sample> alone_ ABSL_GUARDED_BY(mu_);
  int32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t splits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::rollout
