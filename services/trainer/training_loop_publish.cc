// The training loop's publishing and its side of the publish protocol
// (services/coordinator/group_ledger.h): each new version goes into the
// WeightStore (a full anchor or a sparse delta, DeltaPublisher), is
// announced to the coordinator and handed to the WeightPublisher, which
// broadcasts it to the current epoch's group. Part of the TrainingLoop
// class (training_loop.h); runs on the loop's thread.

#include <c10/core/DeviceGuard.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/model_weights.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/device_flattening.h"
#include "common/weights/model_flattening.h"
#include "common/weights/tree_digest.h"
#include "services/trainer/training_loop.h"
#if TANDEM_TRAINER_DEVICE_SYNC
#include <cuda_runtime_api.h>

#include "kernels/cuda/sha256_tree_cuda.h"
#endif
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::trainer {
namespace {

auto Log() { return ComponentLogger("trainer"); }

// The tree root of a version: by the device kernel over `device` (its
// flat copy, complete: FlattenModelToDevice synchronised its stream) when
// the device sync is built and there is one, else by the host over `host`.
// A device failure falls back to the host, with a warning.
absl::StatusOr<std::string> TreeDigestOf(
    const std::vector<uint8_t>& host,
    const weights::DeviceWeightBuffer* device, c10::Device on) {
#if TANDEM_TRAINER_DEVICE_SYNC
  if (device != nullptr && device->payload != nullptr && on.is_cuda()) {
    const int index = on.has_index() ? on.index() : 0;
    absl::Status set = absl::OkStatus();
    if (cudaSetDevice(index) != cudaSuccess) {
      set = absl::InternalError(
          absl::StrCat("cudaSetDevice(", index, ") failed"));
    }
    absl::StatusOr<std::string> root =
        set.ok() ? kernels::cuda::Sha256TreeDevice(device->payload, host.size())
                 : absl::StatusOr<std::string>(set);
    if (root.ok()) return root;
    Log()->warn("weights v{}: tree digest on the device failed ({}); "
                "computing it on the host",
                device->policy_version, root.status().ToString());
  }
#else
  (void)device;
  (void)on;
#endif
  return weights::WeightTreeSha256(host);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const model::ModelWeights>>
TrainingLoop::PublishedWeights() const {
  // No snapshot: StoreVersion flattens the weights into the published
  // buffer before the next step, on this thread, so the master weights
  // (or their conversion) are copied once, not twice.
  ASSIGN_OR_RETURN(std::shared_ptr<const model::ModelWeights> weights,
                   parts_.grpo->CheckedMasterWeights());
  if (weights->config().dtype == parts_.publish_dtype) return weights;
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> converted,
                   weights->To(weights->device(), parts_.publish_dtype));
  return std::shared_ptr<const model::ModelWeights>(std::move(converted));
}

absl::StatusOr<weights::PublishedVersion> TrainingLoop::StoreVersion(
    uint64_t version) {
  ASSIGN_OR_RETURN(auto weights, PublishedWeights());
  std::shared_ptr<const weights::DeviceWeightBuffer> buffer;
  if (parts_.device_ring != nullptr || parts_.device_copies) {
    buffer = StoreDeviceVersion(*weights, version);
  }
  // The host copy is still made when the version is also on the device:
  // the weight store serves pulls, catch-up and shared memory from host
  // bytes, and the manifest's CRCs and SHA-256 are computed from it (the
  // device copy holds the same bytes, so they hold for both). A version
  // flattened on the device is flattened once: the host copy is one
  // device-to-host copy of that buffer.
  std::shared_ptr<std::vector<uint8_t>> flat;
  if (buffer != nullptr) {
    absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> copied =
        weights::CopyDeviceFlatToHost(*buffer, *layout_, weights->device());
    if (copied.ok()) {
      flat = *std::move(copied);
    } else {
      Log()->warn("version {}: {}; flattening it again on the host", version,
                  copied.status().ToString());
    }
  }
  if (flat == nullptr) {
    ASSIGN_OR_RETURN(flat, weights::FlattenModel(*weights, *layout_));
  }
  std::optional<weights::DeviceFlat> device;
  if (buffer != nullptr && parts_.device_copies) {
    device = weights::DeviceFlat{
        .data = static_cast<const uint8_t*>(buffer->payload),
        .bytes = layout_->total_bytes(),
        .owner = buffer};
  }
  ASSIGN_OR_RETURN(tandem::v1::WeightManifest manifest,
                   layout_->BuildManifest(
                       *flat, version,
                       /*with_sha256=*/parts_.config->weight_digest != "off"));
  // The tree digest next to it (weight_sync.tree_digest): what a worker
  // with its staged bytes on a GPU checks there. Computed on the device
  // from the device copy when there is one (the same bytes as the host
  // copy, which was made from it), else from the host bytes.
  if (parts_.config->weight_tree_digest == "on" ||
      (parts_.config->weight_tree_digest == "auto" &&
       parts_.config->device != "cpu")) {
    ASSIGN_OR_RETURN(std::string tree,
                     TreeDigestOf(*flat, buffer.get(), weights->device()));
    manifest.set_tree_sha256(std::move(tree));
  }
  manifest.set_published_unix_ms(absl::ToUnixMillis(absl::Now()));
  // CudaChangeCompactor works on the current device: the weights' one.
  c10::OptionalDeviceGuard device_guard;
  if (weights->device().is_cuda()) device_guard.reset_device(weights->device());
  ASSIGN_OR_RETURN(weights::PublishedVersion published,
                   delta_publisher_->Publish(std::move(manifest), flat,
                                             std::move(device)));
  // The delta first: a worker that sees v's manifest finds the delta it
  // prefers; the full copy serves late joiners and broadcast.
  if (published.delta) {
    RETURN_IF_ERROR(
        parts_.store->Put(published.delta->manifest, published.delta->bytes));
  }
  RETURN_IF_ERROR(
      parts_.store->Put(published.full.manifest, published.full.bytes));
  if (published.reason != weights::PublishReason::kDelta) {
    parts_.weight_sync_metrics->RecordPublishedPayload(
        true, static_cast<double>(published.full.bytes->size()));
  }
  if (published.delta) {
    parts_.weight_sync_metrics->RecordPublishedPayload(
        false, static_cast<double>(published.delta->bytes->size()));
  }
  if (published.density) {
    parts_.weight_sync_metrics->RecordDeltaDensity(*published.density);
  }
  return published;
}

std::shared_ptr<const weights::DeviceWeightBuffer>
TrainingLoop::StoreDeviceVersion(const model::ModelWeights& weights,
                                 uint64_t version) {
  // Flattened on the device, before the version is announced: a worker
  // that reads its manifest finds the device copy. Not fatal: the version
  // is still served by every other path (pull, and broadcast and delta
  // detection from the host copy).
  // A full ring's oldest version, which this one evicts, lends its memory
  // when no lease holds it (nor the delta publisher, which keeps the
  // previous version): no cudaMalloc per version once the ring is full.
  std::shared_ptr<const weights::DeviceWeightBuffer> reuse;
  if (parts_.device_ring != nullptr) {
    reuse = parts_.device_ring->TakeOldestForReuse(layout_->total_bytes());
  }
  absl::StatusOr<std::shared_ptr<weights::DeviceWeightBuffer>> buffer =
      weights::FlattenModelToDevice(
          weights, *layout_, version,
          parts_.device_ring != nullptr ? parts_.device_ring->deferred_frees()
                                        : nullptr,
          std::move(reuse));
  if (!buffer.ok()) {
    if (!device_ring_failed_) {
      Log()->warn(
          "version {} not kept in device memory ({}); workers get it by the "
          "host paths (pull, and broadcast from host bytes)",
          version, buffer.status().ToString());
    }
    device_ring_failed_ = true;
    return nullptr;
  }
  device_ring_failed_ = false;
  std::shared_ptr<const weights::DeviceWeightBuffer> kept = *std::move(buffer);
  if (parts_.device_ring != nullptr) parts_.device_ring->Put(kept);
  return kept;
}

absl::StatusOr<GrpoStepStats> TrainingLoop::StepAndStoreForTest(
    const std::vector<ScoredPromptGroup>& groups,
    weights::PublishedVersion* published) {
  ASSIGN_OR_RETURN(GrpoStepStats stats, parts_.grpo->Step(groups));
  ASSIGN_OR_RETURN(weights::PublishedVersion stored,
                   StoreVersion(stats.policy_version));
  if (published != nullptr) *published = std::move(stored);
  return stats;
}

namespace {

// Answers that say nothing about the publish itself: the coordinator was
// unreachable, restarting or timed out, so the same publish is sent again.
bool RetryablePublishError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DATA_LOSS:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status TrainingLoop::Publish(uint64_t version,
                                   const std::string& batch_id) {
  ASSIGN_OR_RETURN(weights::PublishedVersion published, StoreVersion(version));
  const tandem::v1::WeightManifest& manifest = published.full.manifest;
  tandem::v1::PublishPolicyVersionRequest request;
  *request.mutable_manifest() = manifest;
  request.set_weight_server_address(parts_.weight_server_address());
  request.set_batch_id(batch_id);
  tandem::v1::PublishPolicyVersionResponse response;
  // The same (batch, version) until the coordinator answers: it records
  // the pair once and acknowledges repeats (publish protocol). Each try
  // names the current member id (it changes when the coordinator restarts).
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 0;; ++attempt) {
    request.set_member_id(parts_.coordinator->member_id());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const grpc::Status status =
        parts_.coordinator->client()->PublishPolicyVersion(&context, request,
                                                           &response);
    if (status.ok()) {
      if (attempt > 0) {
        Log()->info("version {} (batch {}) acknowledged after {} retries",
                    version, batch_id, attempt);
      }
      break;
    }
    if (!RetryablePublishError(status.error_code())) {
      return rpc::ToAbslStatus(status);
    }
    if (stopping_) {
      unacknowledged_step_ = true;
      return absl::UnavailableError(absl::StrCat(
          "stopping with version ", version, " (batch ", batch_id,
          ") not acknowledged by the coordinator: ", status.error_message()));
    }
    parts_.metrics->publish_retries.Increment();
    if (attempt == 0 || attempt % 20 == 0) {
      Log()->warn(
          "publishing version {} (batch {}) failed: {}; retrying the same "
          "publish until the coordinator answers",
          version, batch_id, status.error_message());
    }
    parts_.clock->SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  if (parts_.publisher != nullptr) {
    parts_.publisher->Broadcast(response.group(), request.member_id(),
                                std::move(published));
  }
  return absl::OkStatus();
}

absl::Status TrainingLoop::AdoptCoordinatorVersion(
    const absl::Status& refusal) {
  parts_.metrics->publishes_refused.Increment();
  const uint64_t ours = parts_.grpo->policy_version();
  // The coordinator's latest version, as its heartbeat answers report it.
  const uint64_t theirs = parts_.coordinator->cluster_policy_version();
  Log()->error(
      "the coordinator refused version {}: {}; its latest version is {}: "
      "publishing these weights (with the refused batch trained in) as "
      "version {} without a batch",
      ours, refusal.ToString(), theirs, theirs + 1);
  parts_.grpo->set_policy_version(theirs + 1);
  return Publish(theirs + 1, "");
}

bool TrainingLoop::ReconcileVersionOnce() {
  if (version_reconciled_) return true;
  const std::string member = parts_.coordinator->member_id();
  if (member.empty()) return false;
  // Before the first pull: the coordinator learns which version these
  // weights hold; what versions after it trained is queued again or
  // counted lost, and batches of an earlier trainer are released.
  tandem::v1::ResumeTrainingRequest request;
  request.set_member_id(member);
  request.set_policy_version(parts_.grpo->policy_version());
  tandem::v1::ResumeTrainingResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const grpc::Status status = parts_.coordinator->client()->ResumeTraining(
      &context, request, &response);
  if (!status.ok()) {
    Log()->warn("ResumeTraining at policy version {} failed: {}; retrying",
                parts_.grpo->policy_version(), status.error_message());
    parts_.clock->SleepFor(absl::Milliseconds(400));
    return false;
  }
  version_reconciled_ = true;
  parts_.metrics->resume_groups_requeued.Set(response.groups_requeued());
  parts_.metrics->resume_groups_lost.Set(response.groups_lost());
  if (response.groups_requeued() + response.groups_lost() > 0) {
    Log()->warn(
        "resuming at policy version {} while the coordinator is at {}: {} "
        "groups trained after it are queued again, {} are lost (too stale "
        "to train again)",
        parts_.grpo->policy_version(), response.policy_version(),
        response.groups_requeued(), response.groups_lost());
  }
  parts_.checkpoints->ReconcileVersion(response.policy_version(),
                                       parts_.resumed, parts_.grpo);
  parts_.status->Update([&](tandem::v1::TrainerStatus& s) {
    s.set_policy_version(parts_.grpo->policy_version());
  });
  return true;
}

void TrainingLoop::HoldBeforePublishForTest(uint64_t version,
                                            const std::string& batch_id) {
  static const char* const kHoldFile =
      std::getenv("TANDEM_TEST_HOLD_PUBLISH_FILE");
  if (kHoldFile == nullptr || *kHoldFile == 0) return;
  if (!std::filesystem::exists(kHoldFile)) return;
  const std::string held = absl::StrCat(kHoldFile, ".held");
  {
    std::ofstream out(held + ".tmp");
    out << version << " " << batch_id << "\n";
  }
  std::filesystem::rename(held + ".tmp", held);
  Log()->warn(
      "fault injection: holding version {} (batch {}) before its "
      "publish while {} exists",
      version, batch_id, kHoldFile);
  while (!stopping_ && std::filesystem::exists(kHoldFile)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::error_code ignored;
  std::filesystem::remove(held, ignored);
}

}  // namespace tandem::trainer
