#include "common/model/device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tandem::model {

std::string DeviceName::ToString() const {
  if (!cuda) return "cpu";
  return index < 0 ? "cuda" : absl::StrCat("cuda:", index);
}

absl::StatusOr<DeviceName> ParseDeviceName(absl::string_view key,
                                           absl::string_view value) {
  DeviceName device;
  if (value == "cpu") return device;
  absl::string_view rest = value;
  if (absl::ConsumePrefix(&rest, "cuda")) {
    device.cuda = true;
    if (rest.empty()) return device;
    int index = -1;
    if (absl::ConsumePrefix(&rest, ":") && !rest.empty() &&
        rest.find_first_not_of("0123456789") == absl::string_view::npos &&
        absl::SimpleAtoi(rest, &index) && index >= 0) {
      device.index = index;
      return device;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      key, ": '", value, "' is not a device (cpu, cuda or cuda:N)"));
}

int CudaDeviceCount() {
  const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
  if (!hooks.hasCUDART() || !hooks.hasCUDA()) return 0;
  return hooks.getNumGPUs();
}

absl::Status CheckDeviceUsable(absl::string_view key,
                               absl::string_view value) {
  return ResolveDevice(key, value).status();
}

absl::StatusOr<DeviceName> ResolveDevice(absl::string_view key,
                                         absl::string_view value) {
  auto device = ParseDeviceName(key, value);
  if (!device.ok() || !device->cuda) return device;
  const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
  if (!hooks.hasCUDART()) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": '", value,
                     "': this build's LibTorch has no CUDA support (use "
                     "cpu, or a CUDA build of torch)"));
  }
  const int count = CudaDeviceCount();
  if (count == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return absl::FailedPreconditionError(absl::StrCat(
        key, ": '", value,
        "': no CUDA device is visible to this process (no NVIDIA driver or "
        "GPU",
        visible != nullptr ? absl::StrCat(", CUDA_VISIBLE_DEVICES='",
                                          visible, "'")
                           : "",
        "); use cpu"));
  }
  if (device->index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": '", value, "': device index ", device->index,
                     " is out of range: ", count, " CUDA device",
                     count == 1 ? "" : "s", " visible (cuda:0",
                     count > 1 ? absl::StrCat("..cuda:", count - 1) : "",
                     ")"));
  }
  return *device;
}

absl::StatusOr<std::optional<WeightDType>> ParseDTypeName(
    absl::string_view key, absl::string_view value) {
  if (value == "auto") return std::optional<WeightDType>();
  if (value == "float32") return std::optional(WeightDType::kFloat32);
  if (value == "bfloat16") return std::optional(WeightDType::kBFloat16);
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": '", value,
                   "' is not a dtype (auto, float32 or bfloat16)"));
}

WeightDType ResolveDType(std::optional<WeightDType> requested,
                         const DeviceName& device, WeightDType checkpoint) {
  if (requested.has_value()) return *requested;
  return device.cuda ? WeightDType::kBFloat16 : checkpoint;
}

}  // namespace tandem::model
