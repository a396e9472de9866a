#include "common/weights/device_flattening.h"

#include <ATen/ATen.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"
#include "common/weights/cuda_ipc_device.h"

namespace tandem::weights {

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
    uint64_t policy_version, std::shared_ptr<DeferredFrees> frees) {
  const c10::Device device = weights.device();
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights on ", device.str(),
                     " cannot be flattened into CUDA IPC memory"));
  }
  const int index = device.has_index() ? device.index() : 0;
  auto buffer = AllocateDeviceWeightBuffer(
      index, policy_version, layout.total_bytes(), std::move(frees));
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
