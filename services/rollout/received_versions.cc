#include "services/rollout/received_versions.h"

#include <iterator>
#include <utility>

namespace tandem::rollout {

ReceivedVersions::ReceivedVersions(uint64_t live_version) {
  status_.received_version = live_version;
}

void ReceivedVersions::Record(uint64_t version, std::string digest,
                              weights::SyncTransport transport,
                              int64_t published_unix_ms) {
  absl::MutexLock lock(&mu_);
  if (published_unix_ms > 0) {
    published_ms_[version] = published_unix_ms;
    while (published_ms_.size() > kMaxPublishTimes) {
      published_ms_.erase(published_ms_.begin());
    }
  }
  ++count_;
  status_.received_version = version;
  status_.digest = std::move(digest);
  status_.transport = weights::SyncTransportName(transport);
}

void ReceivedVersions::SetEpoch(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  status_.epoch = epoch;
}

std::optional<int64_t> ReceivedVersions::TakePublishedMs(uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto it = published_ms_.find(version);
  if (it == published_ms_.end()) return std::nullopt;
  const int64_t published_ms = it->second;
  published_ms_.erase(published_ms_.begin(), std::next(it));
  return published_ms;
}

uint64_t ReceivedVersions::version() const {
  absl::MutexLock lock(&mu_);
  return status_.received_version;
}

uint64_t ReceivedVersions::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

uint64_t ReceivedVersions::epoch() const {
  absl::MutexLock lock(&mu_);
  return status_.epoch;
}

WeightSyncStatus ReceivedVersions::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace tandem::rollout
