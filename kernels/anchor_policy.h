#pragma once

// When to publish a full anchor instead of a sparse delta, and what a
// receiver must fetch to reach a version.
//
// Versions v with v % anchor_every == 0 are always full anchors (version 0,
// the initial weights, is one). The publisher may also publish a full
// version early when a delta would be too large to be worth it
// (ShouldPublishFull); a manifest records its anchor in anchor_version, so
// receivers plan from that rather than from the cadence alone.
//
// Thread-safe: immutable after construction.

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"

namespace tandem::kernels {

// What a receiver fetches to reach `target`: optionally the full anchor,
// then the deltas for versions first_delta..target (none when
// first_delta > target).
struct CatchUpPlan {
  bool fetch_full = false;
  uint64_t full_version = 0;  // meaningful when fetch_full
  uint64_t first_delta = 0;
  uint64_t target = 0;
  uint64_t num_deltas() const {
    return first_delta > target ? 0 : target - first_delta + 1;
  }
};

class AnchorPolicy {
 public:
  // REQUIRES: anchor_every >= 1 (1 means every version is full);
  // max_delta_fraction in (0, 1].
  static absl::StatusOr<AnchorPolicy> Create(uint64_t anchor_every,
                                             double max_delta_fraction = 0.5);

  uint64_t anchor_every() const { return anchor_every_; }

  // True when the cadence makes `version` a full anchor.
  bool IsScheduledAnchor(uint64_t version) const {
    return version % anchor_every_ == 0;
  }

  // The scheduled anchor at or before `version`.
  uint64_t ScheduledAnchorAtOrBefore(uint64_t version) const {
    return version - version % anchor_every_;
  }

  // Publisher side: full when scheduled, or when the encoded delta is more
  // than max_delta_fraction of the full payload.
  bool ShouldPublishFull(uint64_t version, uint64_t delta_bytes,
                         uint64_t full_bytes) const;

  // Receiver side. `have` is the version the receiver holds exactly (none
  // after a restart); `target_anchor` is the target manifest's
  // anchor_version. Deltas are replayed from `have` when it is at or after
  // the target's anchor, otherwise from the anchor.
  static CatchUpPlan PlanCatchUp(std::optional<uint64_t> have, uint64_t target,
                                 uint64_t target_anchor);

 private:
  AnchorPolicy(uint64_t anchor_every, double max_delta_fraction)
      : anchor_every_(anchor_every), max_delta_fraction_(max_delta_fraction) {}

  uint64_t anchor_every_;
  double max_delta_fraction_;
};

}  // namespace tandem::kernels
