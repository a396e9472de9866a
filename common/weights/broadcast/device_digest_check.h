#pragma once

// The SHA-256 check of a version received into device memory
// (ReceiveDeviceOverBroadcast's DeviceReceiveOptions::digest_check), the
// device counterpart of StagingWeights' "Digest check": the staged bytes
// are hashed through pinned host pieces (TensorSha256, device_digest.h)
// and compared with the expected digest before the version may go live.

#include <c10/core/Device.h>

#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/staging_weights.h"

namespace tandem::weights {

// A check of bytes on `device` (a CUDA device, or the CPU for host
// memory). The expected digest is what `trusted` fetches over the
// authenticated plane when set (a broadcast's in-band manifest is not
// trusted), else the manifest's sha256. An empty expected digest (a
// trainer that predates it) passes, as it does for StagingWeights; a
// mismatch is VerifyWeightSha256's DataLoss (IsDigestMismatch). `trusted`
// must outlive the check.
DeviceDigestCheck DeviceSha256Check(c10::Device device,
                                    TrustedDigestSource* trusted = nullptr);

}  // namespace tandem::weights
