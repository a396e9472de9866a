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
// Same-host path: SharedFull() copies a FULL payload once into a
// shared-memory segment (shared_weight_segment.h) that workers on this host
// map. The segment lives while the version's FULL payload is retained: it is
// unlinked when that payload is evicted or replaced, by
// DropSharedSegments(), and when the store is destroyed.

#include <cstdint>
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
  // Keeps payloads of the newest `retain_versions` versions (>= 1), and
  // always the FULL payload of the newest anchor so that deltas after it
  // stay usable.
  explicit WeightStore(size_t retain_versions = 8);

  // Adds a payload; manifest.kind() says which. InvalidArgument for an
  // unspecified kind or a FULL payload whose size is not total_bytes.
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
  // (0 = latest), created on the first call. NotFound when no FULL payload
  // of it is retained; the creation's error (e.g. ResourceExhausted for a
  // full /dev/shm) otherwise. Const: a segment is a cached copy of a
  // stored payload, not part of what the store holds.
  absl::StatusOr<std::shared_ptr<const SharedWeightSegment>> SharedFull(
      uint64_t version) const;
  // Unlinks every segment (they are made again on demand).
  void DropSharedSegments() const;
  // The segments' name stem ("/tandem-w-<pid>-<pidns>-<random>").
  const std::string& segment_name_stem() const { return segment_stem_; }

 private:
  struct Entry {
    std::optional<StoredPayload> full;
    std::optional<StoredPayload> delta;
    // SharedFull's copy of `full`; reset whenever `full` changes.
    mutable std::shared_ptr<const SharedWeightSegment> segment;
  };
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t retain_;
  const std::string segment_stem_;
  // Serializes segment creation (a copy of the payload) without holding
  // mu_, so Put() and readers do not wait for it.
  mutable absl::Mutex share_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> versions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
