#pragma once

// Flattening a model's weights into device memory: the trainer's side of
// CUDA IPC weight sync (cuda_ipc.h). The same bytes as FlattenModel
// (model_flattening.h) at the same layout offsets, written by tensor copies
// on the weights' own device, with no host copy.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/flat_weight_layout.h"

namespace tandem::model {
class ModelWeights;
}  // namespace tandem::model

namespace tandem::weights {

// Writes the flat buffer of `weights` into `dst`, a contiguous uint8 tensor
// of layout.total_bytes() bytes on any device (padding zeroed), with copies
// queued on that device's current stream. REQUIRES: `layout` is
// LayoutForModel of compatible weights; InvalidArgument names a tensor
// that does not fit, or a `dst` of the wrong size or dtype.
absl::Status FlattenModelInto(const model::ModelWeights& weights,
                              const FlatWeightLayout& layout, at::Tensor dst);

// A new exported device buffer (AllocateDeviceWeightBuffer, on the
// weights' CUDA device) holding the flat buffer of `weights` as version
// `policy_version`; the copies have finished when it returns (the device
// is synchronized), so it can be offered at once. `frees`: as
// AllocateDeviceWeightBuffer's. FailedPrecondition when
// the weights are not on a CUDA device.
//
// `reuse`: a buffer no one else holds (DeviceVersionRing::
// TakeOldestForReuse) whose memory is written instead of allocating: same
// allocation, handle and deleter, a new token (so that an offer of its
// old version no longer matches it) and the new version. Used only when
// its payload is layout.total_bytes() long and on the weights' device;
// otherwise it is released and a buffer allocated.
absl::StatusOr<std::shared_ptr<DeviceWeightBuffer>> FlattenModelToDevice(
    const model::ModelWeights& weights, const FlatWeightLayout& layout,
    uint64_t policy_version, std::shared_ptr<DeferredFrees> frees = nullptr,
    std::shared_ptr<const DeviceWeightBuffer> reuse = nullptr);

// A new host flat buffer (pageable) holding the layout.total_bytes() bytes
// at `buffer.payload`, memory of `device` (a FlattenModelToDevice result on
// the weights' device; tests pass host memory and kCPU): ONE copy, finished
// when it returns. The trainer's host copy of a version it flattened on the
// device, equal to FlattenModel's by construction.
absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> CopyDeviceFlatToHost(
    const DeviceWeightBuffer& buffer, const FlatWeightLayout& layout,
    c10::Device device);

}  // namespace tandem::weights
