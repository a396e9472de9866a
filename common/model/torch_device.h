#pragma once

// The LibTorch device of a DeviceName (common/model/device.h); "cuda" is
// device 0.

#include <c10/core/Device.h>

#include <algorithm>

#include "common/model/device.h"

namespace tandem::model {

inline c10::Device TorchDevice(const DeviceName& device) {
  if (!device.cuda) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA,
                     static_cast<c10::DeviceIndex>(std::max(device.index, 0)));
}

}  // namespace tandem::model
