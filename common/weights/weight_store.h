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

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

 private:
  struct Entry {
    std::optional<StoredPayload> full;
    std::optional<StoredPayload> delta;
  };
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t retain_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> versions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
