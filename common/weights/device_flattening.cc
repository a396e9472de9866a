#include "common/weights/device_flattening.h"

#include <ATen/ATen.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"
#include "common/weights/cuda_ipc_device.h"

namespace tandem::weights {
namespace {

// `reuse` as the buffer of `policy_version` (FlattenModelToDevice), or
// null when it cannot be (none, another size or device).
absl::StatusOr<std::shared_ptr<DeviceWeightBuffer>> ReuseDeviceWeightBuffer(
    std::shared_ptr<const DeviceWeightBuffer> reuse, int device,
    uint64_t policy_version, uint64_t payload_bytes) {
  if (reuse == nullptr || reuse->offer.size() != payload_bytes) return nullptr;
  absl::StatusOr<v1::CudaIpcPeer> here = CudaIpcPeerOf(device);
  if (!here.ok()) return here.status();
  if (here->device_uuid() != reuse->offer.device_uuid()) return nullptr;
  auto buffer = std::make_shared<DeviceWeightBuffer>(*reuse);
  reuse.reset();  // `buffer` now holds the memory alone
  buffer->policy_version = policy_version;
  const std::string token = RandomIpcToken();
  try {
    const auto options = at::TensorOptions().dtype(at::kByte);
    at::from_blob(static_cast<uint8_t*>(buffer->payload) + payload_bytes,
                  {static_cast<int64_t>(token.size())},
                  options.device(at::kCUDA, device))
        .copy_(at::from_blob(const_cast<char*>(token.data()),
                             {static_cast<int64_t>(token.size())}, options));
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus(
        "writing a reused device weight buffer's token", e);
  }
  buffer->offer.set_token(token);
  return buffer;
}

}  // namespace

absl::Status FlattenModelInto(const model::ModelWeights& weights,
                              const FlatWeightLayout& layout, at::Tensor dst) {
  try {
    if (dst.scalar_type() != at::kByte || !dst.is_contiguous() ||
        dst.dim() != 1 ||
        static_cast<uint64_t>(dst.numel()) != layout.total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flattening weights into a ", c10::toString(dst.scalar_type()),
          " tensor of ", dst.numel(), " elements; the layout needs ",
          layout.total_bytes(), " contiguous uint8"));
    }
    dst.zero_();
    const auto& tensors = weights.tensors();
    for (const TensorPlacement& placement : layout.tensors()) {
      const auto it = tensors.find(placement.info.name);
      if (it == tensors.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", placement.info.name, "' of the layout is missing"));
      }
      const at::Tensor src = it->second.detach().contiguous();
      const uint64_t bytes = static_cast<uint64_t>(src.numel()) *
                             static_cast<uint64_t>(src.element_size());
      if (bytes != placement.info.byte_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", placement.info.name, "': ", bytes,
                         " bytes, layout holds ", placement.info.byte_size));
      }
      if (bytes == 0) continue;
      dst.narrow(0, static_cast<int64_t>(placement.offset),
                 static_cast<int64_t>(bytes))
          .copy_(src.view({-1}).view(at::kByte).to(dst.device()));
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("flattening weights", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeviceWeightBuffer>> FlattenModelToDevice(
    const model::ModelWeights& weights, const FlatWeightLayout& layout,
    uint64_t policy_version, std::shared_ptr<DeferredFrees> frees,
    std::shared_ptr<const DeviceWeightBuffer> reuse) {
  const c10::Device device = weights.device();
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights on ", device.str(),
                     " cannot be flattened into CUDA IPC memory"));
  }
  const int index = device.has_index() ? device.index() : 0;
  absl::StatusOr<std::shared_ptr<DeviceWeightBuffer>> buffer =
      ReuseDeviceWeightBuffer(std::move(reuse), index, policy_version,
                              layout.total_bytes());
  if (buffer.ok() && *buffer == nullptr) {
    buffer = AllocateDeviceWeightBuffer(index, policy_version,
                                        layout.total_bytes(), std::move(frees));
  }
  if (!buffer.ok()) return buffer.status();
  try {
    at::Tensor dst = at::from_blob(
        (*buffer)->payload, {static_cast<int64_t>(layout.total_bytes())},
        at::TensorOptions().dtype(at::kByte).device(at::kCUDA, index));
    if (absl::Status s = FlattenModelInto(weights, layout, dst); !s.ok()) {
      return s;
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("flattening weights", e);
  }
  if (absl::Status s = FinishDeviceWrites(index); !s.ok()) return s;
  return buffer;
}

absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> CopyDeviceFlatToHost(
    const DeviceWeightBuffer& buffer, const FlatWeightLayout& layout,
    c10::Device device) {
  if (buffer.payload == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights v", buffer.policy_version, ": no device payload to copy"));
  }
  const auto n = static_cast<int64_t>(layout.total_bytes());
  auto host = std::make_shared<std::vector<uint8_t>>(layout.total_bytes());
  try {
    const at::Tensor src =
        at::from_blob(buffer.payload, {n},
                      at::TensorOptions().dtype(at::kByte).device(device));
    // Pageable destination: copy_ returns after the copy has finished.
    at::from_blob(host->data(), {n}, at::TensorOptions().dtype(at::kByte))
        .copy_(src);
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus(
        absl::StrCat("copying weights v", buffer.policy_version, " from ",
                     device.str(), " to the host"),
        e);
  }
  return host;
}

}  // namespace tandem::weights
