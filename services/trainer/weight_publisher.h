#pragma once

// WeightPublisher: the trainer's weight broadcast and its side of the
// re-send protocol. It owns the BroadcastSender (the rendezvous store and
// the sender thread) and the ClusterWatcher that wakes a re-send; the
// trainer holds one and hands it every acknowledged version (Broadcast).
//
// Re-send protocol: the sender reports each attempted job on its thread
// (OnBroadcast). A failed collective is reported to the coordinator
// (SyncWeightGroup with failed_epoch), which forms the next epoch without
// the dead member; the publisher then waits (at most the broadcast
// timeout on its clock, woken by the watch stream, with a last look at the
// coordinator when the timeout ends) for that epoch and hands its first
// version, FULL from the weight store, back to the sender (Resend).
//
// Shutdown (c10d's shutdown() then abort()): Stop(drain) stops taking
// versions, lets a broadcast under way finish for at most `drain`, then
// aborts it (the collective is interrupted, not waited for: see
// BroadcastSender) and joins every thread it owns. Callbacks (the sender's
// listener, the re-send wait) run only on those threads, so none runs
// after Stop() returns: the publisher outlives its callbacks. A broadcast
// cut short by the stop is not reported to the coordinator (the trainer is
// leaving; the receivers see the reset and catch up by pull).
//
// Thread-safety: Broadcast() from any thread; Start/Stop from the owner.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/cluster/cluster_watcher.h"
#include "common/cluster/coordinator_client.h"
#include "common/weights/broadcast/broadcast_sender.h"
#include "common/weights/delta_publisher.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::trainer {

class WeightPublisher {
 public:
  // The coordinator as the publisher sees it: its client and this
  // trainer's member id ("" while unregistered).
  struct Coordinator {
    cluster::CoordinatorClient* client = nullptr;
    std::function<std::string()> member_id;
  };

  // Starts the rendezvous store (options.store_port; 0 picks one).
  // `store` (the versions to re-send), `metrics` and `clock` (the wait for
  // the re-send epoch, options.timeout, and the watch stream's waits) must
  // outlive the publisher. The broadcasts themselves keep real-time Gloo
  // deadlines.
  static absl::StatusOr<std::unique_ptr<WeightPublisher>> Create(
      const weights::BroadcastSenderOptions& options,
      const weights::WeightStore* store, weights::WeightSyncMetrics* metrics,
      Clock* clock = RealClock());
  ~WeightPublisher();  // Stop()
  WeightPublisher(const WeightPublisher&) = delete;
  WeightPublisher& operator=(const WeightPublisher&) = delete;

  // host:port of the rendezvous store, to advertise to the coordinator.
  std::string store_address() const;

  // Starts the sender thread and the watch stream. `coordinator.client` must
  // outlive the publisher.
  void Start(Coordinator coordinator);

  // Queues `published` (acknowledged by the coordinator, which assigned it
  // `group`) for broadcast; a group whose rank 0 is not `member_id` is not
  // ours and the version is skipped. Ignored once stopping.
  void Broadcast(const tandem::v1::BroadcastGroup& group,
                 const std::string& member_id,
                 weights::PublishedVersion published);

  // See the top of this file. Idempotent.
  void Stop(absl::Duration drain = absl::ZeroDuration());

  // Blocks (real time, at most `timeout`) until the sender has no job and
  // none under way, the listener included: a failed broadcast's re-send
  // has been handed over or given up. Whether that happened.
  bool WaitIdleForTest(absl::Duration timeout) const;

 private:
  WeightPublisher(const weights::WeightStore* store,
                  weights::WeightSyncMetrics* metrics, Clock* clock);
  // The sender's listener (sender thread).
  void OnBroadcast(const weights::BroadcastOutcome& outcome);
  // After reporting the failure of `failed` (sender thread): waits for the
  // next epoch and re-sends its first version.
  void ResendAfterFailure(const tandem::v1::BroadcastGroup& failed);

  const weights::WeightStore* const store_;
  weights::WeightSyncMetrics* const metrics_;
  Clock* const clock_;
  absl::Duration timeout_;
  Coordinator coordinator_;  // set by Start(), read on the sender thread
  std::unique_ptr<cluster::ClusterWatcher> watcher_;
  std::unique_ptr<weights::BroadcastSender> sender_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace tandem::trainer
