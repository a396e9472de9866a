#pragma once

// SampleSubmitter streams finished samples back to the coordinator in
// batches from a background thread, retrying while the coordinator is
// unavailable. Flush() waits (with a deadline) until everything queued was
// delivered. Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::rollout {

class SampleSubmitter {
 public:
  SampleSubmitter(tandem::v1::Coordinator::Stub* stub,
                  std::function<std::string()> member_id,
                  int32_t max_batch = 64);
  ~SampleSubmitter();

  void Start();
  void Enqueue(tandem::v1::Sample sample);
  // Waits until the queue is delivered or `deadline` passes; true if empty.
  bool Flush(absl::Duration deadline);
  // Samples queued or being submitted.
  size_t pending() const;
  void Stop();

  uint64_t submitted_total() const;
  uint64_t rejected_total() const;

 private:
  void Run();

  tandem::v1::Coordinator::Stub* const stub_;
  const std::function<std::string()> member_id_;
  const int32_t max_batch_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<tandem::v1::Sample> queue_ ABSL_GUARDED_BY(mu_);
  int32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::rollout
