#include "common/weights/weight_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::weights {

WeightStore::WeightStore(size_t retain_versions, SharedMemory shared_memory)
    : retain_(std::max<size_t>(retain_versions, 1)),
      shared_memory_(shared_memory),
      segment_stem_(SharedWeightSegment::NewNameStem()) {}

absl::StatusOr<std::shared_ptr<const SharedWeightSegment>>
WeightStore::MakeSegment(const StoredPayload& payload) const {
  const uint64_t v = payload.manifest.policy_version();
  absl::StatusOr<std::unique_ptr<SharedWeightSegment>> made =
      SharedWeightSegment::Create(
          absl::StrCat(segment_stem_, "-v", v), v,
          {payload.bytes->data(), payload.bytes->size()});
  if (!made.ok()) return made.status();
  return std::shared_ptr<const SharedWeightSegment>(*std::move(made));
}

absl::Status WeightStore::Put(
    const v1::WeightManifest& manifest,
    std::shared_ptr<const std::vector<uint8_t>> bytes) {
  if (bytes == nullptr) return absl::InvalidArgumentError("null payload");
  const uint64_t v = manifest.policy_version();
  const v1::WeightPayloadKind kind = manifest.kind();
  if (kind != v1::WEIGHT_PAYLOAD_KIND_FULL &&
      kind != v1::WEIGHT_PAYLOAD_KIND_DELTA) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights v", v, ": payload kind unspecified"));
  }
  if (kind == v1::WEIGHT_PAYLOAD_KIND_FULL &&
      bytes->size() != manifest.total_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights v", v, ": full payload is ", bytes->size(),
                     " bytes, manifest says ", manifest.total_bytes()));
  }
  // Segments dropped here are unlinked after mu_ is released (`unlink` is
  // destroyed after the locks below).
  std::vector<std::shared_ptr<const SharedWeightSegment>> unlink;
  const bool share = shared_memory_ == SharedMemory::kAtPut &&
                     kind == v1::WEIGHT_PAYLOAD_KIND_FULL;
  absl::MutexLockMaybe share_lock(share ? &share_mu_ : nullptr);
  std::shared_ptr<const SharedWeightSegment> segment;
  absl::Status share_error;
  if (share) {
    {
      // A FULL payload put again for the same version: its old segment
      // holds the name, so it goes first (readers stream meanwhile).
      absl::MutexLock lock(&mu_);
      auto it = versions_.find(v);
      if (it != versions_.end() && it->second.segment != nullptr) {
        unlink.push_back(std::move(it->second.segment));
      }
    }
    unlink.clear();
    // The copy, without mu_: readers of other versions do not wait.
    absl::StatusOr<std::shared_ptr<const SharedWeightSegment>> made =
        MakeSegment(StoredPayload{manifest, bytes});
    if (made.ok()) {
      segment = *std::move(made);
    } else {
      share_error = made.status();
    }
  }
  uint64_t latest = 0;
  {
    absl::MutexLock lock(&mu_);
    Entry& entry = versions_[v];
    if (kind == v1::WEIGHT_PAYLOAD_KIND_FULL) {
      entry.full = StoredPayload{manifest, std::move(bytes)};
      if (entry.segment != nullptr) unlink.push_back(std::move(entry.segment));
      entry.segment = std::move(segment);
      entry.share_error = share_error;
    } else {
      entry.delta = StoredPayload{manifest, std::move(bytes)};
    }
    Evict(&unlink);
    latest = versions_.rbegin()->first;
  }
  // The change notification, once the version is visible (after mu_).
  absl::MutexLock lock(&listeners_mu_);
  for (const auto& [id, listener] : listeners_) listener(latest);
  return absl::OkStatus();
}

int WeightStore::AddListener(
    std::function<void(uint64_t latest)> listener) const {
  absl::MutexLock lock(&listeners_mu_);
  const int id = next_listener_++;
  listeners_.emplace(id, std::move(listener));
  return id;
}

void WeightStore::RemoveListener(int id) const {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(id);
}

void WeightStore::Evict(
    std::vector<std::shared_ptr<const SharedWeightSegment>>* unlink) {
  if (versions_.empty()) return;
  // The newest anchor: the highest version holding a full payload at or
  // below the latest version's anchor_version.
  const Entry& latest = versions_.rbegin()->second;
  const v1::WeightManifest& m =
      latest.full ? latest.full->manifest : latest.delta->manifest;
  const uint64_t anchor = m.anchor_version();
  const uint64_t newest = versions_.rbegin()->first;
  // kAtPut keeps the segments of the newest kSharedFullVersions FULL
  // versions (the oldest of them is `oldest_shared`) and of the anchor.
  uint64_t oldest_shared = newest + 1;
  size_t full_seen = 0;
  for (auto it = versions_.rbegin();
       it != versions_.rend() && full_seen < kSharedFullVersions; ++it) {
    if (it->second.full) {
      oldest_shared = it->first;
      ++full_seen;
    }
  }
  for (auto it = versions_.begin(); it != versions_.end();) {
    Entry& entry = it->second;
    const bool old = newest - it->first >= retain_;
    const bool keep_segment = shared_memory_ == SharedMemory::kOnRequest ||
                              it->first >= oldest_shared || it->first == anchor;
    if (entry.segment != nullptr &&
        (!keep_segment || (old && it->first != anchor))) {
      unlink->push_back(std::move(entry.segment));
    }
    if (old && it->first != anchor) {
      it = versions_.erase(it);
    } else if (old && it->first == anchor) {
      entry.delta.reset();  // keep only the anchor's full copy
      ++it;
    } else {
      ++it;
    }
  }
}

std::optional<uint64_t> WeightStore::latest_version() const {
  absl::MutexLock lock(&mu_);
  if (versions_.empty()) return std::nullopt;
  return versions_.rbegin()->first;
}

absl::StatusOr<StoredPayload> WeightStore::Get(
    uint64_t version, v1::WeightPayloadKind kind) const {
  absl::MutexLock lock(&mu_);
  if (versions_.empty()) {
    return absl::NotFoundError("no weights version published yet");
  }
  if (version == 0) version = versions_.rbegin()->first;
  auto it = versions_.find(version);
  if (it != versions_.end()) {
    if (kind == v1::WEIGHT_PAYLOAD_KIND_FULL && it->second.full) {
      return *it->second.full;
    }
    if (kind == v1::WEIGHT_PAYLOAD_KIND_DELTA && it->second.delta) {
      return *it->second.delta;
    }
  }
  return absl::NotFoundError(absl::StrCat("weights v", version,
                                          " is not retained as ",
                                          v1::WeightPayloadKind_Name(kind)));
}

absl::StatusOr<v1::WeightManifest> WeightStore::Manifest(
    uint64_t version) const {
  absl::MutexLock lock(&mu_);
  if (versions_.empty()) {
    return absl::NotFoundError("no weights version published yet");
  }
  if (version == 0) version = versions_.rbegin()->first;
  auto it = versions_.find(version);
  if (it == versions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("weights v", version, " is not retained"));
  }
  return it->second.full ? it->second.full->manifest
                         : it->second.delta->manifest;
}

absl::StatusOr<const WeightStore::Entry*> WeightStore::FindFull(
    uint64_t* version) const {
  if (*version == 0 && !versions_.empty()) {
    *version = versions_.rbegin()->first;
  }
  auto it = versions_.find(*version);
  if (it == versions_.end() || !it->second.full) {
    return absl::NotFoundError(
        absl::StrCat("weights v", *version, " is not retained as FULL"));
  }
  return &it->second;
}

absl::StatusOr<std::shared_ptr<const SharedWeightSegment>>
WeightStore::SharedFull(uint64_t version) const {
  if (shared_memory_ == SharedMemory::kAtPut) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<const Entry*> entry = FindFull(&version);
    if (!entry.ok()) return entry.status();
    if ((*entry)->segment != nullptr) return (*entry)->segment;
    if (!(*entry)->share_error.ok()) return (*entry)->share_error;
    return absl::NotFoundError(absl::StrCat(
        "weights v", version, " is not kept in shared memory (only the newest ",
        kSharedFullVersions, " full versions and the newest anchor are)"));
  }
  absl::MutexLock create_lock(&share_mu_);
  StoredPayload payload;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<const Entry*> entry = FindFull(&version);
    if (!entry.ok()) return entry.status();
    if ((*entry)->segment != nullptr) return (*entry)->segment;
    payload = *(*entry)->full;
  }
  absl::StatusOr<std::shared_ptr<const SharedWeightSegment>> segment =
      MakeSegment(payload);
  if (!segment.ok()) return segment.status();
  absl::MutexLock lock(&mu_);
  auto it = versions_.find(version);
  // Evicted or replaced while copying: do not keep (or offer) the copy.
  if (it == versions_.end() || !it->second.full ||
      it->second.full->bytes != payload.bytes) {
    return absl::NotFoundError(absl::StrCat(
        "weights v", version, " was evicted while it was being shared"));
  }
  it->second.segment = *segment;
  return segment;
}

void WeightStore::DropSharedSegments() const {
  std::vector<std::shared_ptr<const SharedWeightSegment>> dropped;
  absl::MutexLock lock(&mu_);
  for (auto& [version, entry] : versions_) {
    if (entry.segment != nullptr) dropped.push_back(std::move(entry.segment));
  }
  // `dropped` unlinks them after the lock is released (it is destroyed
  // after `lock`).
}

}  // namespace tandem::weights
