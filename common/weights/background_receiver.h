#pragma once

// BackgroundReceiver: runs a WeightReceiver on its own thread, feeding a
// StagingWeights, so the rollout engine only ever calls ready()/Commit()
// at its step boundaries. After staging a version it waits until the
// engine has committed it before receiving the next one (deltas need the
// previous version live), so at most one version is staged at a time.
//
// Errors other than deadline/cancel (a rejected version, a lost group) are
// counted and retried after `retry_backoff`; the worker's owner reads
// stats() for metrics and decides when to fall back to another transport.
//
// Thread-safety: Start/Stop from the owning thread; stats() from any.

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/weights/weight_transport.h"

namespace tandem::weights {

struct BackgroundReceiverOptions {
  // Each ReceiveNext() call waits at most this long, so Stop() is prompt
  // even for transports whose Cancel() is slow.
  absl::Duration receive_slice = absl::Seconds(1);
  absl::Duration retry_backoff = absl::Milliseconds(100);
  // Times retry_backoff (the receive slices are deadlines of the
  // transport's real I/O). Must outlive the receiver.
  Clock* clock = RealClock();
};

struct BackgroundReceiverStats {
  uint64_t staged = 0;
  uint64_t errors = 0;
  std::string last_error;
};

class BackgroundReceiver {
 public:
  // `receiver` and `staging` must outlive this object.
  BackgroundReceiver(WeightReceiver* receiver, StagingWeights* staging,
                     BackgroundReceiverOptions options = {});
  ~BackgroundReceiver();

  BackgroundReceiver(const BackgroundReceiver&) = delete;
  BackgroundReceiver& operator=(const BackgroundReceiver&) = delete;

  void Start();
  // Cancels the receiver (for good: a stopped receiver is not restarted)
  // and joins the thread. Idempotent.
  void Stop();

  BackgroundReceiverStats stats() const;

 private:
  void Run();

  WeightReceiver* const receiver_;
  StagingWeights* const staging_;
  const BackgroundReceiverOptions options_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable absl::Mutex mu_;
  BackgroundReceiverStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
