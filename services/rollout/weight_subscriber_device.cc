// The WeightSubscriber's device go-live: a version the pull receiver left
// in the CUDA IPC sink (grpc_pull_receiver.h, "Handoff mode") is verified
// where it lies (device_go_live.h: CRC-32C on the device, finite check,
// trusted SHA-256) and staged for the engine as views into that copy, so
// the engine's swap makes it live with no host round trip. Then the host
// staging follows (a copy to the host, off the engine's critical path),
// because the pull receiver plans from it and deltas apply to its bytes.
// Part of the WeightSubscriber class (weight_subscriber.h); runs on the
// subscriber's thread.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/model/model_weights.h"
#include "common/weights/device_go_live.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_digest.h"
#include "services/rollout/weight_subscriber.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

// Copies `staged` (any device) into host bytes `dst` of the same size.
absl::Status CopyToHost(const at::Tensor& staged, absl::Span<uint8_t> dst) {
  try {
    at::from_blob(dst.data(), {static_cast<int64_t>(dst.size())}, at::kByte)
        .copy_(staged);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(
        "copying the live version to the host: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WeightSubscriber::GoLiveOnDevice(
    const v1::WeightManifest& manifest, weights::SyncTransport transport,
    absl::Time started) {
  const uint64_t version = manifest.policy_version();
  const weights::FlatWeightLayout& layout = staging_->layout();
  const weights::StagedIpcCopy copy = options_.pull_cuda_ipc->TakeStagedCopy();
  if (copy.memory == nullptr) {
    // Nothing to verify (cannot happen after a handoff): not a refusal of
    // the version, which the next pull fetches again.
    Log()->error("policy version {}: the CUDA IPC sink handed no copy over",
                 version);
    return absl::InternalError(
        absl::StrCat("weights v", version, ": no CUDA IPC copy handed over"));
  }
  absl::Status refused;
  absl::StatusOr<at::Tensor> staged = absl::InternalError("no copy");
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights =
      absl::InternalError("no copy");
  if (copy.bytes != layout.total_bytes()) {
    refused = absl::DataLossError(absl::StrCat(
        "weights v", version, ": the CUDA IPC sink handed over ", copy.bytes,
        " bytes, the layout has ", layout.total_bytes()));
  } else if (staged = weights::StagedCopyTensor(copy); !staged.ok()) {
    refused = staged.status();
  } else {
    weights::DeviceGoLiveOptions go;
    go.crc32c = copy.crc32c;
    // Trusted: this manifest came over gRPC (GetManifest), as on the host
    // pull path.
    go.expected_sha256 = manifest.sha256();
    // The tree root, checked on the device when the trainer sent one
    // (GoLiveDigest::kAuto); else the SHA-256 above.
    go.expected_tree_sha256 = manifest.tree_sha256();
    go.tree_sha256 = copy.tree_sha256;
    weights = weights::GoLiveFromStagedTensor(wire_config_, manifest, layout,
                                              *staged, go);
    if (!weights.ok()) refused = weights.status();
  }
  if (!refused.ok()) {
    // Counted as the host path counts its refusals (the staging's stats,
    // read by CountNonFinite and CountDigestChecks); live stays, and the
    // version is not fetched again.
    staging_->RecordRefusedElsewhere(
        version, weights::StagingWeights::RefusalOf(refused));
    if (options_.metrics != nullptr)
      options_.metrics->RecordRejected(transport);
    Log()->warn("policy version {} rejected: {}", version, refused.ToString());
    return refused;
  }
  // To the live weights' dtype (on the device) only when the wire dtype
  // differs; otherwise the views themselves.
  weights = MatchLiveWeights(*model_, *std::move(weights));
  if (!weights.ok()) {
    Log()->warn("policy version {} verified but not staged: {}", version,
                weights.status().ToString());
    return weights.status();
  }
  source_->Stage(version, *std::move(weights));
  const absl::Time staged_at = absl::Now();
  if (!device_live_logged_) {
    device_live_logged_ = true;
    Log()->info(
        "policy version {}: verified on {} and staged as views into the CUDA "
        "IPC copy (no host round trip); later versions go live the same way",
        version, staged->device().str());
  }
  RecordReceived(manifest, transport, started, staged_at, 0);
  received_.Record(version, weights::ManifestDigest(manifest), transport,
                   manifest.published_unix_ms());
  // The engine may swap from here on. The host staging follows: the pull
  // receiver plans from its live version and deltas apply to its bytes.
  // The copy was verified on the device just now, so the staging checks
  // only the CRC-32C of what reached the host
  // (StagingWeights::CommitVerifiedElsewhere says why that is safe).
  const absl::Status followed = staging_->CommitVerifiedElsewhere(
      manifest,
      [&](absl::Span<uint8_t> dst) { return CopyToHost(*staged, dst); });
  if (!followed.ok()) {
    Log()->error(
        "policy version {} is live from device memory, but the host staging "
        "could not follow it ({}); the next pull plans from v{}",
        version, followed.ToString(),
        staging_->live_version().has_value()
            ? std::to_string(*staging_->live_version())
            : std::string("none"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::rollout
