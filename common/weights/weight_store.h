#pragma once

// WeightStore: the published weight versions the trainer keeps for the
// catch-up (pull) path. Each version may be held as a FULL payload (the
// flat buffer), as a DELTA payload (an encoded delta on base_version), or
// both. The trainer stores a FULL payload for anchors and for the latest
// version, and a DELTA for every version published as one, so a worker can
// either replay deltas from what it has or fetch the newest full copy.
//
// Thread-safe. Payloads are immutable and shared, so readers keep streaming
// a version even after it is evicted.
//
// Same-host path: a FULL payload can be offered to workers on this host as
// a shared-memory segment (shared_weight_segment.h) that they map. How the
// segment is made depends on the store's SharedMemory mode:
//   kOnRequest (default): SharedFull() copies the payload into a segment on
//     the first call for a version, on the caller's thread (for the weight
//     server, the thread that serves the request).
//   kAtPut (the trainer with weight_sync.shared_memory): Put() makes the
//     segment of every FULL payload on the publisher's thread, before the
//     version becomes visible, so SharedFull() never copies: it returns the
//     segment made at Put, the error that making it met (e.g.
//     ResourceExhausted for a full /dev/shm), or NotFound. To bound
//     /dev/shm, only the newest kSharedFullVersions FULL versions and the
//     newest anchor keep their segments (catch-up pulls fetch the latest
//     version or the anchor in full; the second newest covers a worker
//     that read the manifest just before the next publish); an older FULL
//     version is streamed.
// Either way a segment lives at most as long as its version's FULL payload
// is retained: it is unlinked when that payload is evicted or replaced, by
// DropSharedSegments(), and when the store is destroyed. A reader that has
// mapped a segment keeps reading the same bytes after the unlink.
//
// Change notification: listeners (AddListener) are told the newest version
// held after every successful Put, so a server can answer waiting clients
// (WeightServerService's long-polled GetManifest) without polling the store.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/weights/shared_weight_segment.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

struct StoredPayload {
  v1::WeightManifest manifest;
  std::shared_ptr<const std::vector<uint8_t>> bytes;
};

class WeightStore {
 public:
  enum class SharedMemory { kOnRequest, kAtPut };
  // kAtPut: how many of the newest FULL versions keep their segments
  // (besides the newest anchor).
  static constexpr size_t kSharedFullVersions = 2;

  // Keeps payloads of the newest `retain_versions` versions (>= 1), and
  // always the FULL payload of the newest anchor so that deltas after it
  // stay usable. `shared_memory`: when segments are made (see above).
  explicit WeightStore(size_t retain_versions = 8,
                       SharedMemory shared_memory = SharedMemory::kOnRequest);

  // Adds a payload; manifest.kind() says which. InvalidArgument for an
  // unspecified kind or a FULL payload whose size is not total_bytes.
  // kAtPut: a FULL payload is first copied into its segment here (one copy
  // of the payload); a segment that cannot be made does not fail the Put
  // (SharedFull reports why, and the payload is streamed instead).
  absl::Status Put(const v1::WeightManifest& manifest,
                   std::shared_ptr<const std::vector<uint8_t>> bytes);

  // Newest version held, if any.
  std::optional<uint64_t> latest_version() const;

  // The payload of `version` (0 = latest) of `kind`; NotFound otherwise.
  absl::StatusOr<StoredPayload> Get(uint64_t version,
                                    v1::WeightPayloadKind kind) const;

  // The manifest a client should see for `version` (0 = latest): the FULL
  // one when a full payload is held, else the DELTA one. NotFound when the
  // version is not retained.
  absl::StatusOr<v1::WeightManifest> Manifest(uint64_t version) const;

  // The shared-memory segment holding the FULL payload of `version`
  // (0 = latest). kOnRequest: created on the first call. kAtPut: the one
  // Put made, never a new copy. NotFound when no FULL payload of it is
  // retained (kAtPut: or it keeps no segment); the creation's error (e.g.
  // ResourceExhausted for a full /dev/shm) otherwise. Const: a segment is a
  // copy of a stored payload, not part of what the store holds.
  absl::StatusOr<std::shared_ptr<const SharedWeightSegment>> SharedFull(
      uint64_t version) const;
  // Unlinks every segment (kOnRequest: they are made again on demand;
  // kAtPut: later Puts make new ones).
  void DropSharedSegments() const;
  SharedMemory shared_memory() const { return shared_memory_; }
  // Calls `listener` with the newest version held after every successful
  // Put, on the thread that called Put, once the store's lock is released
  // (so it may read the store, but must not Put or add or remove
  // listeners). Returns an id for RemoveListener. Const, like SharedFull:
  // who watches the store is not part of what it holds.
  int AddListener(std::function<void(uint64_t latest)> listener) const;
  // Returns once no call of the listener is under way; none is made after.
  void RemoveListener(int id) const;
  // The segments' name stem ("/tandem-w-<pid>-<pidns>-<random>").
  const std::string& segment_name_stem() const { return segment_stem_; }

 private:
  struct Entry {
    std::optional<StoredPayload> full;
    std::optional<StoredPayload> delta;
    // The segment holding a copy of `full`; reset whenever `full` changes.
    mutable std::shared_ptr<const SharedWeightSegment> segment;
    // kAtPut: why Put could not make `segment` (OK otherwise).
    absl::Status share_error;
  };
  // Removes what is no longer retained; segments it drops are moved to
  // `unlink`, to be destroyed (unlinked) after mu_ is released.
  void Evict(std::vector<std::shared_ptr<const SharedWeightSegment>>* unlink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of FULL version `*version` (0: the newest, and `*version`
  // becomes its number), NotFound when none is retained.
  absl::StatusOr<const Entry*> FindFull(uint64_t* version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies `payload` into a new segment for its version.
  absl::StatusOr<std::shared_ptr<const SharedWeightSegment>> MakeSegment(
      const StoredPayload& payload) const;

  const size_t retain_;
  const SharedMemory shared_memory_;
  const std::string segment_stem_;
  // Serializes segment creation (a copy of the payload) without holding
  // mu_, so readers do not wait for it (kAtPut: serializes FULL Puts).
  mutable absl::Mutex share_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> versions_ ABSL_GUARDED_BY(mu_);
  // Held while listeners are called (never together with mu_).
  mutable absl::Mutex listeners_mu_;
  mutable std::map<int, std::function<void(uint64_t)>> listeners_
      ABSL_GUARDED_BY(listeners_mu_);
  mutable int next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;
};

}  // namespace tandem::weights
