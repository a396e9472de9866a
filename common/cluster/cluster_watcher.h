#pragma once

// ClusterWatcher keeps one WatchCluster stream to the coordinator open on
// its own thread and wakes a waiting consumer when an event arrives, so the
// consumer polls the coordinator when something changed instead of on a
// short timer. When the stream breaks (coordinator restart, network) it
// reconnects with capped exponential backoff; a coordinator that does not
// serve WatchCluster (UNIMPLEMENTED), or a member_id the coordinator does
// not know yet (NOT_FOUND), is retried the same way. Consumers check
// watching() to pick their poll interval: while no stream is open they
// must poll as often as they did without a watcher.
//
// A consumer that waits on something else (e.g. a weight pull) can have
// the change pushed to it instead: SetChangeListener.
//
// Thread-safety: all methods are thread-safe. WaitForChange has one
// consumer in mind: an event wakes the next (or current) WaitForChange
// once. Stop() cancels the stream and joins the thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/cluster/coordinator_client.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::cluster {

struct ClusterWatcherOptions {
  // The member id to watch as (called before each connection attempt; ""
  // while unregistered means wait). Null: watch as an observer.
  std::function<std::string()> member_id;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Called on the watcher thread for every event received (optional).
  std::function<void(const tandem::v1::ClusterEvent&)> on_event;
  // Times the reconnect backoff and WaitForChange's wait (not the
  // stream's gRPC deadline). Outlives the watcher.
  Clock* clock = RealClock();
};

class ClusterWatcher {
 public:
  // `client` must outlive the watcher.
  ClusterWatcher(CoordinatorClient* client, ClusterWatcherOptions options);
  ~ClusterWatcher();
  ClusterWatcher(const ClusterWatcher&) = delete;
  ClusterWatcher& operator=(const ClusterWatcher&) = delete;

  void Start();
  // Idempotent.
  void Stop();

  // Waits until an event arrived (or the stream opened or broke) since the
  // previous WaitForChange returned, or `max_wait` passed, or Stop().
  // True when woken by a change.
  bool WaitForChange(absl::Duration max_wait);

  // Wakes WaitForChange as a change would (e.g. the consumer is stopping).
  void Wake();

  // Called on the watcher thread, without the watcher's lock, whenever the
  // stream wakes WaitForChange: with each event received, and with null
  // when a stream opens or ends (watching() already tells which). One
  // listener at a time; null removes it. Returns once no call of the
  // previous listener is under way, so its owner may go away then; the
  // listener must not call SetChangeListener.
  using ChangeListener = std::function<void(const tandem::v1::ClusterEvent*)>;
  void SetChangeListener(ChangeListener listener);

  // A stream is open (the coordinator accepted it).
  bool watching() const;
  // Events received over all streams.
  uint64_t events_received() const;
  // Status that ended the most recent stream (OK before any ended).
  absl::Status last_status() const;

 private:
  void Run();
  // One stream, from connect to its end; returns its final status.
  grpc::Status WatchOnce(const std::string& member_id);
  void MarkChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the change listener, if any (without mu_).
  void NotifyListener(const tandem::v1::ClusterEvent* event)
      ABSL_LOCKS_EXCLUDED(mu_);

  CoordinatorClient* const client_;
  const ClusterWatcherOptions options_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  bool watching_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);
  // The open call, so Stop() can cancel it.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Held while the listener runs (never together with mu_).
  absl::Mutex listener_mu_;
  ChangeListener listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace tandem::cluster
