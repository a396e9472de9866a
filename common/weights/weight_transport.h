#pragma once

// The seam between the trainer, which publishes weight versions, and the
// rollout workers, which receive them into StagingWeights. Transports (in
// process for tests, Gloo/NCCL broadcast, the gRPC catch-up stream)
// implement these two interfaces, so the rollout engine is written once.
//
// A version travels as its manifest plus a payload: for a FULL manifest the
// whole flat buffer (bucket i at buckets[i].byte_offset), for a DELTA
// manifest an encoded delta (kernels/bf16_delta.h) against base_version.
// The manifest's bucket checksums always describe the resulting full
// buffer, so receivers verify deltas and full versions alike.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/weights/staging_weights.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

// Trainer side. Implementations document their own thread-safety; calls to
// Publish() are made from one thread in version order.
class WeightSender {
 public:
  virtual ~WeightSender() = default;

  // Sends one version to the current receivers. Returns once the transport
  // no longer needs `payload` (it may have been copied or fully sent).
  // DeadlineExceeded when `deadline` passes first.
  virtual absl::Status Publish(const v1::WeightManifest& manifest,
                               absl::Span<const uint8_t> payload,
                               absl::Time deadline) = 0;
};

// Worker side. ReceiveNext() is called from one background thread;
// Cancel() from any thread.
class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;

  // Blocks until the next version after staging->live_version() arrives,
  // receives it into `staging` (Begin, buckets or delta, verification) and
  // returns its version, now ready to Commit(). Errors: DeadlineExceeded,
  // Cancelled after Cancel(), DataLoss when verification failed (nothing
  // staged; the transport may offer the version again or the worker falls
  // back to catch-up), FailedPrecondition when only a delta on a version
  // the worker lacks is available.
  virtual absl::StatusOr<uint64_t> ReceiveNext(StagingWeights* staging,
                                               absl::Time deadline) = 0;

  // Makes a blocked or future ReceiveNext() return Cancelled.
  virtual void Cancel() = 0;
};

// Stages `manifest` + `payload` into `staging` (the common receiving step
// every transport ends with once the bytes are local): Begin(), then every
// bucket written and verified, or the delta applied and verified.
absl::Status StagePayload(StagingWeights* staging,
                          const v1::WeightManifest& manifest,
                          absl::Span<const uint8_t> payload);

}  // namespace tandem::weights
