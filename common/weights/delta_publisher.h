#pragma once

// DeltaPublisher: the publisher's half of sparse delta sync (issue 5). Given
// each new version's flat bfloat16 buffer, it decides whether the version
// goes out as a sparse DELTA on the version before it or as a FULL anchor,
// and encodes the delta (kernels/bf16_delta.h).
//
// Version v is published as a DELTA on v-1 when all of these hold:
//   - deltas are enabled (the published dtype is bfloat16, anchor_every > 1);
//   - v-1 is the version published just before (this publisher holds its
//     exact bytes; after a restart or a resume the first version is FULL);
//   - the changed fraction of 16-bit words (bf16_change.h, raw bit
//     patterns) is at most max_density; a denser change is not encoded;
//   - the encoded delta is smaller than the full payload.
// Otherwise, and when v is a scheduled anchor (v % anchor_every == 0,
// AnchorPolicy), v is a FULL anchor, and later deltas chain from it: every
// manifest carries the newest anchor at or before it in anchor_version, the
// contract receivers plan their catch-up with (AnchorPolicy::PlanCatchUp).
// A scheduled anchor that passes the other tests is encoded as a delta on
// v-1 as well: the anchor bounds the replay of late joiners, while a
// receiver that holds v-1 still needs only the delta.
//
// Why bfloat16 only: the codec compares 16-bit words and codes a changed
// word's new value relative to the old one; that is what makes it cheap for
// bf16, where an optimizer step moves a small fraction of the weights by a
// ULP or two. A float32 step changes the low mantissa bits of nearly every
// weight, so a float32 delta would be about as large as the full copy.
//
// Change detection on the device (issue 22 item 4): when the publisher has
// a ChangeCompactor (set_change_compactor; CudaChangeCompactor in
// common/weights/device_delta.h) and both v-1 and v came with a device copy
// (Publish's `device`), the changed words are found and compacted where the
// bytes lie, only the compacted lists (indices, new and old words) come to
// the host, and the host coder encodes them (kernels::EncodeSparseDelta):
// the same decision and the same delta bytes as the host path, without a
// pass of the CPU over both buffers. Otherwise the host path runs.
//
// Thread-compatible: one publishing thread calls Publish().

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/weights/weight_store.h"
#include "kernels/anchor_policy.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

struct DeltaPublishOptions {
  // False: every version is published FULL (e.g. float32 weights).
  bool enabled = true;
  // Every version v with v % anchor_every == 0 is a FULL anchor; >= 1
  // (1 = every version is full, i.e. no deltas).
  uint64_t anchor_every = 16;
  // Largest changed fraction of 16-bit words published as a delta, in
  // (0, 1]. A ULP-sized change costs about one byte per changed word at
  // 10-25% density (docs/benchmarks.md), so a delta at 50% is still about
  // a quarter of the full copy; denser versions are rare and are anchors.
  double max_density = 0.5;
};

// A version's flat buffer as it also lies in device memory (the trainer's
// device copy). The publisher keeps it, through `owner`, while it is the
// base of the next version; its bytes must be complete when Publish() is
// called (the stream that wrote them synchronised), must not change
// meanwhile, and must equal the host `flat` given with it.
struct DeviceFlat {
  const uint8_t* data = nullptr;  // device pointer
  uint64_t bytes = 0;
  std::shared_ptr<const void> owner;  // keeps `data` alive; may be null
};

// What a ChangeCompactor found between two versions.
struct CompactedChange {
  uint64_t changed_words = 0;
  // In increasing index order; filled only when changed_words <= the
  // limit Compact() was given (a denser change is not encoded anyway).
  std::vector<uint64_t> indices;
  std::vector<uint16_t> new_words;
  std::vector<uint16_t> old_words;
};

// Finds and compacts the 16-bit words where two device buffers differ.
class ChangeCompactor {
 public:
  virtual ~ChangeCompactor() = default;
  // REQUIRES: prev.bytes == next.bytes, even. `max_listed`: the lists are
  // copied to the host only when at most this many words changed.
  virtual absl::StatusOr<CompactedChange> Compact(const DeviceFlat& prev,
                                                  const DeviceFlat& next,
                                                  uint64_t max_listed) = 0;
};

// Why a version was published the way it was.
enum class PublishReason {
  kDelta,            // a DELTA on the previous version
  kDisabled,         // deltas off: every version is FULL
  kNoBase,           // the previous version is not held (first, or a gap)
  kScheduledAnchor,  // v % anchor_every == 0 (may also have a delta)
  kDense,            // changed fraction above max_density
  kLarge,            // the encoded delta was not smaller than the full copy
};
const char* PublishReasonName(PublishReason reason);

struct PublishedVersion {
  // The FULL payload, always produced: the latest version and anchors are
  // held in full for late joiners and for broadcast. Its manifest has kind
  // FULL and anchor_version set (v itself for an anchor).
  StoredPayload full;
  // The DELTA payload on v-1 (reason kDelta, and kScheduledAnchor when the
  // change qualifies): the same manifest with kind DELTA and base_version
  // v-1.
  std::optional<StoredPayload> delta;
  PublishReason reason = PublishReason::kNoBase;
  // Changed fraction of 16-bit words against v-1, when compared.
  std::optional<double> density;
  uint64_t changed_words = 0;
  // The change was found on the device (ChangeCompactor), not the host.
  bool compared_on_device = false;
  // The FULL payload's device copy: Publish's `device`, when given (the
  // broadcast sends FULL versions from it; broadcast_sender.h).
  std::optional<DeviceFlat> full_device;
};

class DeltaPublisher {
 public:
  // InvalidArgument naming the option when one is out of range.
  static absl::StatusOr<DeltaPublisher> Create(
      const DeltaPublishOptions& options);

  // Publishes `flat`, the version `manifest` describes (its buckets and
  // checksums; kind, base_version and anchor_version are set here). The
  // buffer becomes the base of the next version and must not change
  // afterwards. A version that is not the last one + 1 (a restart, a
  // renumbering) is a FULL anchor. InvalidArgument when `flat` is not
  // manifest.total_bytes() long.
  // `device`: the same bytes in device memory (see DeviceFlat), kept as the
  // next version's device base; InvalidArgument when its size differs.
  absl::StatusOr<PublishedVersion> Publish(
      v1::WeightManifest manifest,
      std::shared_ptr<const std::vector<uint8_t>> flat,
      std::optional<DeviceFlat> device = std::nullopt);

  // Where change detection runs when both versions have device copies.
  // Null (the default): always on the host. Outlives this publisher.
  void set_change_compactor(ChangeCompactor* compactor) {
    compactor_ = compactor;
  }

  // Forgets the base, so the next version is FULL (e.g. when a version
  // could not be published).
  void Reset();

  const DeltaPublishOptions& options() const { return options_; }

 private:
  DeltaPublisher(const DeltaPublishOptions& options,
                 kernels::AnchorPolicy policy)
      : options_(options), policy_(policy) {}

  DeltaPublishOptions options_;
  kernels::AnchorPolicy policy_;
  // The last version published, its bytes and its anchor.
  std::optional<uint64_t> last_version_;
  std::shared_ptr<const std::vector<uint8_t>> last_;
  std::optional<DeviceFlat> last_device_;
  uint64_t anchor_version_ = 0;
  ChangeCompactor* compactor_ = nullptr;
};

}  // namespace tandem::weights
