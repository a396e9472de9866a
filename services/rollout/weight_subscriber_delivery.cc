// The WeightSubscriber's swap bookkeeping: a received version is committed
// in staging, viewed as ModelWeights in the live weights' dtype and device
// and staged for the engine's swap, recorded (ReceivedVersions) and
// measured; versions the staging refused as non-finite are counted; the
// engine's swap closes the publish-to-live measure. Part of the
// WeightSubscriber class (weight_subscriber.h).

#include <algorithm>

#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/model_weights.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/model_flattening.h"
#include "common/weights/weight_digest.h"
#include "services/rollout/weight_subscriber.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

}  // namespace

void WeightSubscriber::Deliver(uint64_t version,
                               weights::SyncTransport transport,
                               absl::Time started, uint64_t bytes_before) {
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights =
      CommitStaging();
  if (!weights.ok()) {
    if (options_.metrics != nullptr) {
      options_.metrics->RecordRejected(transport);
    }
    Log()->warn("policy version {} rejected: {}", version,
                weights.status().ToString());
    return;
  }
  const absl::Time staged = absl::Now();
  if (*weights != nullptr) source_->Stage(version, *std::move(weights));
  const std::optional<v1::WeightManifest> manifest = staging_->live_manifest();
  // The staging verified every bucket against the manifest's CRC-32C
  // before the commit, so the manifest's checksums are the live bytes':
  // the digest needs no second pass over the buffer.
  std::string digest =
      manifest.has_value() && manifest->buckets_size() > 0
          ? weights::ManifestDigest(*manifest)
          : weights::WeightsDigest(
                staging_->layout().BucketCrcs(staging_->live().bytes));
  if (manifest.has_value()) {
    RecordReceived(*manifest, transport, started, staged, bytes_before);
  }
  received_.Record(version, std::move(digest), transport,
                   manifest.has_value() ? manifest->published_unix_ms() : 0);
}

absl::StatusOr<std::shared_ptr<model::ModelWeights>>
WeightSubscriber::CommitStaging() {
  RETURN_IF_ERROR(staging_->Commit().status());
  // Inplace: the commit released the engine; nothing to stage.
  if (staging_->mode() == weights::StagingMode::kInplace) return nullptr;
  // Double buffer: the tensors view the committed buffer instead of
  // copying it (the staging receives the next version into another buffer
  // while they hold this one).
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> weights,
                   weights::ViewFlatModel(wire_config_, staging_->layout(),
                                          staging_->live_buffer()));
  // To the live weights' device and dtype (a no-op for a CPU worker
  // computing in the published dtype).
  return MatchLiveWeights(*model_, std::move(weights));
}

void WeightSubscriber::RecordReceived(const v1::WeightManifest& manifest,
                                      weights::SyncTransport transport,
                                      absl::Time started, absl::Time staged,
                                      uint64_t bytes_before) {
  if (options_.metrics == nullptr) return;
  // Zero-copy bucket receipt is not counted by StagingWeights: a FULL
  // version moved total_bytes.
  const bool full = manifest.kind() != v1::WEIGHT_PAYLOAD_KIND_DELTA;
  const uint64_t bytes = full ? manifest.total_bytes()
                              : staging_->stats().bytes_received - bytes_before;
  const bool published_known = manifest.published_unix_ms() > 0;
  const absl::Time published =
      absl::FromUnixMillis(manifest.published_unix_ms());
  // A transfer cannot start before the publish: the pull path's wait for
  // a newer version is not transfer time.
  const absl::Time began =
      published_known ? std::max(started, published) : started;
  options_.metrics->RecordVersion(weights::SyncDirection::kReceived, transport,
                                  full, static_cast<double>(bytes),
                                  absl::ToDoubleSeconds(staged - began));
  if (published_known) {
    options_.metrics->RecordPublishToStaged(
        transport, std::max(0.0, absl::ToDoubleSeconds(staged - published)));
  }
}

void WeightSubscriber::CountNonFinite(uint64_t before,
                                      weights::SyncTransport transport) {
  const weights::StagingStats stats = staging_->stats();
  if (stats.nonfinite_versions <= before) return;
  if (options_.metrics != nullptr) {
    for (uint64_t i = before; i < stats.nonfinite_versions; ++i) {
      options_.metrics->RecordNonFinite(transport);
    }
  }
  Log()->error(
      "refused policy version {} received by {}: its weights hold non-finite "
      "values (see the warning that follows); live version {} kept, waiting "
      "for a newer one",
      staging_->refused_version().value_or(0),
      weights::SyncTransportName(transport),
      staging_->live_version().has_value()
          ? std::to_string(*staging_->live_version())
          : std::string("none"));
}

void WeightSubscriber::CountDigestChecks(const weights::StagingStats& before,
                                         weights::SyncTransport transport,
                                         const absl::Status& result) {
  const weights::StagingStats stats = staging_->stats();
  if (options_.metrics != nullptr) {
    for (uint64_t i = before.digest_mismatches; i < stats.digest_mismatches;
         ++i) {
      options_.metrics->RecordDigestMismatch(transport);
    }
    for (uint64_t i = before.unsigned_versions; i < stats.unsigned_versions;
         ++i) {
      options_.metrics->RecordUnsigned(transport);
    }
  }
  if (stats.digest_mismatches > before.digest_mismatches) {
    Log()->error(
        "refused a weights version received by {}: {}; live version {} kept",
        weights::SyncTransportName(transport),
        weights::IsDigestMismatch(result) ? std::string(result.message())
                                          : std::string("sha256 mismatch"),
        staging_->live_version().has_value()
            ? std::to_string(*staging_->live_version())
            : std::string("none"));
  }
  if (stats.unsigned_versions > before.unsigned_versions &&
      !unsigned_logged_) {
    unsigned_logged_ = true;
    Log()->warn(
        "a weights version received by {} carried no SHA-256 (the trainer "
        "predates it): checked by CRC-32C only; counted in "
        "tandem_weight_sync_unsigned_versions_total, logged once",
        weights::SyncTransportName(transport));
  }
}

void WeightSubscriber::RecordLive(uint64_t version) {
  const std::optional<int64_t> published_ms =
      received_.TakePublishedMs(version);
  if (!published_ms.has_value() || options_.metrics == nullptr) return;
  options_.metrics->RecordPublishToLive(std::max(
      0.0, absl::ToDoubleSeconds(absl::Now() -
                                 absl::FromUnixMillis(*published_ms))));
}

}  // namespace tandem::rollout
