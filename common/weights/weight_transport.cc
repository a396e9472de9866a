#include "common/weights/weight_transport.h"

#include "absl/strings/str_cat.h"

namespace tandem::weights {

absl::Status StagePayload(StagingWeights* staging,
                          const v1::WeightManifest& manifest,
                          absl::Span<const uint8_t> payload) {
  if (absl::Status s = staging->Begin(manifest); !s.ok()) return s;
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA) {
    return staging->ApplyDelta(payload);
  }
  if (payload.size() != manifest.total_bytes()) {
    staging->Abort();
    return absl::DataLossError(absl::StrCat(
        "weights v", manifest.policy_version(), ": full payload is ",
        payload.size(), " bytes, manifest says ", manifest.total_bytes()));
  }
  for (const BucketRange& b : staging->layout().buckets()) {
    if (absl::Status s = staging->WriteBucketChunk(
            b.index, 0, payload.subspan(b.offset, b.size));
        !s.ok()) {
      staging->Abort();
      return s;
    }
    if (absl::Status s = staging->FinishBucket(b.index); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tandem::weights
