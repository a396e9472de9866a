#pragma once

// BroadcastSender: the trainer's side of weight broadcast. It hosts the
// rendezvous store (a c10d TCPStore) for every membership epoch and, on its
// own thread, broadcasts each queued version to the group the coordinator
// assigned to it (GlooBroadcastGroup as rank 0), so training never waits
// for a transfer.
//
// Per job: a group with no receivers is skipped (and the previous group
// left). When the job's epoch (key prefix) differs from the current one,
// the old group is destroyed and the new one formed (rendezvous with the
// deadline). A failed rendezvous or collective aborts and destroys the
// group, so survivors blocked in it fail fast; the rest of that epoch's
// jobs are dropped, and the outcome is reported to the listener, which
// tells the coordinator (the next epoch forms without stale members and the
// missed version is caught up by pull).
//
// Queued jobs of one epoch are coalesced: only the newest version of an
// epoch is sent when several wait, but the last version of every epoch is
// always sent, because receivers of that epoch wait for it.
//
// Thread-safety: Enqueue() from any thread; Start/Stop from the owner.
// Stop() may wait up to `timeout` for a collective under way.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/weights/gloo_broadcast_transport.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

struct BroadcastSenderOptions {
  // Host the rendezvous store listens on and that workers connect to.
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;  // 0 picks a free port
  // Address Gloo binds for its pairs.
  std::string bind_host = "127.0.0.1";
  // Deadline of the rendezvous and of every collective.
  absl::Duration timeout = absl::Seconds(10);
};

// What happened to one job, for metrics and failure reports.
struct BroadcastOutcome {
  v1::BroadcastGroup group;
  uint64_t version = 0;
  bool full = true;
  uint64_t bytes = 0;
  double seconds = 0;
  absl::Status status;  // not OK: the group was aborted
};

class BroadcastSender {
 public:
  // Called on the sender thread after every job that was attempted.
  using Listener = std::function<void(const BroadcastOutcome&)>;

  static absl::StatusOr<std::unique_ptr<BroadcastSender>> Create(
      const BroadcastSenderOptions& options, Listener listener);
  ~BroadcastSender();

  // host:port of the rendezvous store, to advertise to the coordinator.
  std::string store_address() const;

  void Start();
  void Stop();
  // Stops, waiting at most `wait` for a rendezvous or collective under way
  // (Gloo cannot interrupt one). Returns false when the thread is still
  // blocked: it is then detached, and the caller must keep this object
  // alive until the process exits (e.g. release() its unique_ptr) -- the
  // thread wakes only at its own timeout.
  bool Stop(absl::Duration wait);

  // Queues `manifest` + `payload` (FULL: the flat buffer; DELTA: the
  // encoded delta) for `group`.
  void Enqueue(const v1::BroadcastGroup& group,
               const v1::WeightManifest& manifest,
               std::shared_ptr<const std::vector<uint8_t>> payload);

 private:
  struct Job {
    v1::BroadcastGroup group;
    v1::WeightManifest manifest;
    std::shared_ptr<const std::vector<uint8_t>> payload;
  };

  BroadcastSender(const BroadcastSenderOptions& options, Listener listener);
  void Run();
  // Broadcasts one job on the sender thread.
  void Send(const Job& job);

  const BroadcastSenderOptions options_;
  const Listener listener_;
  std::unique_ptr<GlooRendezvousStore> store_;
  std::thread thread_;

  // Sender thread only.
  std::unique_ptr<GlooBroadcastGroup> group_;
  std::string group_prefix_;
  bool group_failed_ = false;

  absl::Notification finished_;  // Run() returned
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
