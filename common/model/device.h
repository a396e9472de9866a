#pragma once

// Where a daemon's tensors live and in which dtype, as named in its config:
//   model.device  cpu | cuda | cuda:N
//   model.dtype   auto | float32 | bfloat16   (auto: bfloat16 on a CUDA
//                 device, the checkpoint's own dtype on the CPU)
// A device this process cannot use is an error that names the key and the
// value; nothing ever falls back to the CPU silently. This header includes
// no LibTorch, so configuration code can validate without it.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"

namespace tandem::model {

// A parsed device name. index is -1 for "cuda" (the current device, 0).
struct DeviceName {
  bool cuda = false;
  int index = -1;
  // "cpu", "cuda" or "cuda:N".
  std::string ToString() const;
};

// Syntax only: InvalidArgument "<key>: '<value>' is not a device (cpu,
// cuda or cuda:N)".
absl::StatusOr<DeviceName> ParseDeviceName(absl::string_view key,
                                           absl::string_view value);

// ParseDeviceName, then whether this process can place tensors there:
// FailedPrecondition naming the key and value when LibTorch was built
// without CUDA, no CUDA device is visible (no driver, no GPU,
// CUDA_VISIBLE_DEVICES empty), or the index is out of range.
absl::StatusOr<DeviceName> ResolveDevice(absl::string_view key,
                                         absl::string_view value);

// ResolveDevice's verdict only (configuration validation).
absl::Status CheckDeviceUsable(absl::string_view key, absl::string_view value);

// How many CUDA devices this process sees (0 without CUDA).
int CudaDeviceCount();

// "auto" gives nullopt (choose with ResolveDType); "float32" | "bfloat16".
// InvalidArgument naming the key otherwise.
absl::StatusOr<std::optional<WeightDType>> ParseDTypeName(
    absl::string_view key, absl::string_view value);

// The dtype to compute in: `requested` when set, else bfloat16 on a CUDA
// device and `checkpoint` (the model's own dtype) on the CPU.
WeightDType ResolveDType(std::optional<WeightDType> requested,
                         const DeviceName& device, WeightDType checkpoint);

}  // namespace tandem::model
