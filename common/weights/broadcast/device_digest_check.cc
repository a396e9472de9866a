#include "common/weights/broadcast/device_digest_check.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/weights/device_digest.h"

namespace tandem::weights {

DeviceDigestCheck DeviceSha256Check(c10::Device device,
                                    TrustedDigestSource* trusted) {
  return [device, trusted](const v1::WeightManifest& manifest,
                           const uint8_t* d_staging,
                           uint64_t bytes) -> absl::Status {
    std::string expected = manifest.sha256();
    if (trusted != nullptr) {
      absl::StatusOr<std::string> t =
          trusted->TrustedSha256(manifest.policy_version());
      if (!t.ok()) return t.status();
      expected = *std::move(t);
    }
    if (expected.empty()) return absl::OkStatus();
    at::Tensor view;
    try {
      view = at::from_blob(const_cast<uint8_t*>(d_staging),
                           {static_cast<int64_t>(bytes)},
                           at::TensorOptions().dtype(at::kByte).device(device));
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("weights v", manifest.policy_version(),
                       ": cannot view the staged bytes on ", device.str(), ": ",
                       e.what_without_backtrace()));
    }
    return VerifyTensorWeightSha256(manifest.policy_version(), expected, view);
  };
}

}  // namespace tandem::weights
