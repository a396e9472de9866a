#include "common/weights/delta_publisher.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"

namespace tandem::weights {

const char* PublishReasonName(PublishReason reason) {
  switch (reason) {
    case PublishReason::kDelta:
      return "delta";
    case PublishReason::kDisabled:
      return "deltas disabled";
    case PublishReason::kNoBase:
      return "no base version";
    case PublishReason::kScheduledAnchor:
      return "scheduled anchor";
    case PublishReason::kDense:
      return "change too dense";
    case PublishReason::kLarge:
      return "delta not smaller";
  }
  return "?";
}

absl::StatusOr<DeltaPublisher> DeltaPublisher::Create(
    const DeltaPublishOptions& options) {
  if (!(options.max_density > 0.0 && options.max_density <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta max_density must be in (0, 1], got ", options.max_density));
  }
  absl::StatusOr<kernels::AnchorPolicy> policy =
      kernels::AnchorPolicy::Create(options.anchor_every);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta ", policy.status().message()));
  }
  return DeltaPublisher(options, *policy);
}

void DeltaPublisher::Reset() {
  last_version_.reset();
  last_.reset();
  last_device_.reset();
}

absl::StatusOr<PublishedVersion> DeltaPublisher::Publish(
    v1::WeightManifest manifest,
    std::shared_ptr<const std::vector<uint8_t>> flat,
    std::optional<DeviceFlat> device) {
  const uint64_t v = manifest.policy_version();
  if (flat == nullptr || flat->size() != manifest.total_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights v", v, ": payload is ", flat ? flat->size() : 0,
                     " bytes, manifest says ", manifest.total_bytes()));
  }
  if (device.has_value() &&
      (device->data == nullptr || device->bytes != flat->size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights v", v, ": device copy is ", device->bytes,
        " bytes, the payload ", flat->size()));
  }
  PublishedVersion out;
  const bool have_base = last_version_.has_value() && *last_version_ + 1 == v &&
                         last_ != nullptr && last_->size() == flat->size() &&
                         flat->size() % 2 == 0;
  std::optional<std::vector<uint8_t>> delta;
  if (!options_.enabled || options_.anchor_every <= 1) {
    out.reason = PublishReason::kDisabled;
  } else if (!have_base) {
    out.reason = PublishReason::kNoBase;
  } else {
    const absl::Span<const uint16_t> prev = kernels::AsWords(*last_);
    const absl::Span<const uint16_t> next = kernels::AsWords(*flat);
    // The most changed words max_density allows.
    const auto max_changed = static_cast<uint64_t>(
        options_.max_density * static_cast<double>(next.size()));
    std::optional<CompactedChange> change;
    if (compactor_ != nullptr && device.has_value() &&
        last_device_.has_value()) {
      absl::StatusOr<CompactedChange> found =
          compactor_->Compact(*last_device_, *device, max_changed);
      if (!found.ok()) {
        return absl::Status(found.status().code(),
                            absl::StrCat("weights v", v, ": device change "
                                         "detection: ",
                                         found.status().message()));
      }
      change = *std::move(found);
      out.compared_on_device = true;
      out.changed_words = change->changed_words;
    } else {
      out.changed_words = kernels::CountChangedWords(prev, next);
    }
    out.density = next.empty() ? 0.0
                               : static_cast<double>(out.changed_words) /
                                     static_cast<double>(next.size());
    // (A compactor that did not list the words counted them as too many.)
    if (*out.density > options_.max_density ||
        (change.has_value() && change->indices.size() != out.changed_words)) {
      out.reason = PublishReason::kDense;
    } else {
      absl::StatusOr<std::vector<uint8_t>> encoded =
          change.has_value()
              ? kernels::EncodeSparseDelta(next.size(), change->indices,
                                           change->new_words,
                                           change->old_words)
              : kernels::EncodeBf16Delta(prev, next);
      if (!encoded.ok()) return encoded.status();
      if (encoded->size() >= flat->size()) {
        out.reason = PublishReason::kLarge;
      } else {
        out.reason = PublishReason::kDelta;
        delta = *std::move(encoded);
      }
    }
    if (policy_.IsScheduledAnchor(v)) {
      out.reason = PublishReason::kScheduledAnchor;
    }
  }
  if (out.reason != PublishReason::kDelta) anchor_version_ = v;
  manifest.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  manifest.set_base_version(0);
  manifest.set_anchor_version(anchor_version_);
  if (delta.has_value()) {
    v1::WeightManifest as_delta = manifest;
    as_delta.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
    as_delta.set_base_version(v - 1);
    out.delta = StoredPayload{
        std::move(as_delta),
        std::make_shared<const std::vector<uint8_t>>(*std::move(delta))};
  }
  out.full = StoredPayload{std::move(manifest), flat};
  last_version_ = v;
  last_ = std::move(flat);
  out.full_device = device;
  last_device_ = std::move(device);
  return out;
}

}  // namespace tandem::weights
