#pragma once

// ClusterWatchers: the coordinator's open WatchCluster streams.
//
// Contract:
//   - Open() answers one WatchCluster call. The stream's first messages
//     are a snapshot: the latest PolicyVersionEvent (if any version was
//     published) and the current MembershipEpochEvent (if an epoch was
//     formed), taken under the same lock that Publish() fans out under, so
//     a watcher never misses an event between its snapshot and its stream.
//   - Publish() hands an event to every open stream and never blocks on
//     one: each stream has one write in flight at most, and a later event
//     of the same kind replaces a queued one (the newest version or epoch
//     is what a watcher needs), so a watcher that does not read holds at
//     most one queued event per kind. Events older than the latest one of
//     their kind (a lower version or epoch) are ignored.
//   - Shutdown() queues a ShutdownEvent on every stream, finishes each with
//     OK once its queued events are written, and answers later Open() calls
//     with UNAVAILABLE. Cancelled streams (the client went away) are
//     finished and forgotten.
//
// Thread-safe. Must outlive the gRPC server that calls Open().

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "prometheus/gauge.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

class ClusterWatchers {
 public:
  // `open_streams` (tandem_coordinator_cluster_watchers) counts open
  // streams; may be null.
  explicit ClusterWatchers(prometheus::Gauge* open_streams);
  ~ClusterWatchers();
  ClusterWatchers(const ClusterWatchers&) = delete;
  ClusterWatchers& operator=(const ClusterWatchers&) = delete;

  // The reactor of a new stream (snapshot first, then events).
  grpc::ServerWriteReactor<tandem::v1::ClusterEvent>* Open();

  // A reactor that answers `status` at once (a refused call).
  static grpc::ServerWriteReactor<tandem::v1::ClusterEvent>* Reject(
      const grpc::Status& status);

  // Fans out a PolicyVersionEvent or MembershipEpochEvent (see contract).
  void Publish(const tandem::v1::ClusterEvent& event);

  // Sends ShutdownEvent{reason} and finishes every stream with OK.
  void Shutdown(const std::string& reason);

  // Streams open now.
  size_t open_streams() const;

 private:
  class Stream;
  friend class Stream;
  void Forget(Stream* stream);

  prometheus::Gauge* const gauge_;
  mutable absl::Mutex mu_;
  std::set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  std::optional<tandem::v1::ClusterEvent> latest_version_ ABSL_GUARDED_BY(mu_);
  std::optional<tandem::v1::ClusterEvent> latest_epoch_ ABSL_GUARDED_BY(mu_);
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::coordinator
