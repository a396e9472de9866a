#pragma once

// ReceivedVersions: the WeightSubscriber's record of what it delivered to
// the engine (the swap bookkeeping): the latest version received, how many
// were, the status that `tandemctl worker status` shows, and the publish
// time of recent versions, for the publish-to-live metric once the engine
// makes one live. Thread-safe: the subscriber's thread records, any thread
// reads.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/weights/weight_sync_metrics.h"

namespace tandem::rollout {

// What the subscriber holds, for status output.
struct WeightSyncStatus {
  uint64_t received_version = 0;
  std::string digest;     // weights::WeightsDigest of the received bytes
  std::string transport;  // "broadcast" | "pull" | "" before any version
  uint64_t epoch = 0;     // broadcast epoch joined (0 = none)
};

class ReceivedVersions {
 public:
  // `live_version`: the version the worker's weights hold at start.
  explicit ReceivedVersions(uint64_t live_version);

  // `version` was staged for the engine: its weights' digest, the transport
  // that brought it and its publish time (manifest.published_unix_ms; 0:
  // unknown, not recorded for publish-to-live).
  void Record(uint64_t version, std::string digest,
              weights::SyncTransport transport, int64_t published_unix_ms);
  // The broadcast epoch joined (0 = none).
  void SetEpoch(uint64_t epoch);

  // The engine made `version` live: its publish time when it was recorded
  // (and forgets it and every older one); nullopt otherwise.
  std::optional<int64_t> TakePublishedMs(uint64_t version);

  uint64_t version() const;
  uint64_t count() const;
  uint64_t epoch() const;
  WeightSyncStatus status() const;

 private:
  // Publish times kept for versions not yet made live.
  static constexpr size_t kMaxPublishTimes = 16;

  mutable absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  // received_version is the latest version received.
  WeightSyncStatus status_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int64_t> published_ms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
