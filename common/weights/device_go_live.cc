#include "common/weights/device_go_live.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/tree_digest.h"
#include "kernels/crc32c.h"

namespace tandem::weights {
namespace {

// The LibTorch dtype of a float format.
at::ScalarType TorchTypeOf(kernels::FloatFormat format) {
  switch (format) {
    case kernels::FloatFormat::kF32:
      return at::kFloat;
    case kernels::FloatFormat::kBF16:
      return at::kBFloat16;
    case kernels::FloatFormat::kF16:
      return at::kHalf;
  }
  return at::kFloat;
}

// The float dtype of a layout tensor, or nullopt for other dtypes.
std::optional<at::ScalarType> FloatType(v1::DType dtype) {
  const std::optional<kernels::FloatFormat> format = FloatFormatOf(dtype);
  if (!format.has_value()) return std::nullopt;
  return TorchTypeOf(*format);
}

absl::Status CheckBuffer(uint64_t version, const FlatWeightLayout& layout,
                         const at::Tensor& staged) {
  if (!staged.defined() || staged.scalar_type() != at::kByte ||
      !staged.is_contiguous() || staged.dim() != 1 ||
      static_cast<uint64_t>(staged.numel()) != layout.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights v", version, ": the staged buffer must be a contiguous 1-D ",
        "uint8 tensor of ", layout.total_bytes(), " bytes, got ",
        staged.defined() ? staged.toString() + " of " +
                               std::to_string(staged.numel()) + " elements"
                         : std::string("none")));
  }
  return absl::OkStatus();
}

// The tensor `placement` of `staged`, viewed as `dtype`.
at::Tensor View(const at::Tensor& staged, const TensorPlacement& placement,
                at::ScalarType dtype) {
  return staged
      .narrow(0, static_cast<int64_t>(placement.offset),
              static_cast<int64_t>(placement.info.byte_size))
      .view(dtype)
      .view(placement.info.shape);
}

// Any device: torch isfinite on the tensor's device. One flag per float
// tensor, computed there; the host reads them once for the whole version.
// A flagged tensor (a refusal, so its cost does not matter) is copied to
// the host and scanned there by the host path's scan, so that both paths
// refuse with the same code and message (finite_weights.h).
absl::Status CheckFiniteOnDevice(uint64_t version,
                                 const FlatWeightLayout& layout,
                                 const at::Tensor& staged) {
  std::vector<at::Tensor> bad;
  std::vector<size_t> which;
  const std::vector<TensorPlacement>& tensors = layout.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::optional<at::ScalarType> dtype =
        FloatType(tensors[t].info.dtype);
    if (!dtype.has_value() || tensors[t].info.byte_size == 0) continue;
    bad.push_back(
        at::logical_not(at::isfinite(View(staged, tensors[t], *dtype))).any());
    which.push_back(t);
  }
  if (bad.empty()) return absl::OkStatus();
  const at::Tensor flags = at::stack(bad).to(at::kCPU);
  const bool* flag = flags.data_ptr<bool>();
  for (size_t i = 0; i < which.size(); ++i) {
    if (!flag[i]) continue;
    const TensorPlacement& p = tensors[which[i]];
    const at::Tensor bytes =
        staged
            .narrow(0, static_cast<int64_t>(p.offset),
                    static_cast<int64_t>(p.info.byte_size))
            .to(at::kCPU)
            .contiguous();
    absl::Status refused = CheckTensorPieceFinite(
        version, layout, which[i], p.offset,
        {static_cast<const uint8_t*>(bytes.data_ptr()), p.info.byte_size});
    if (!refused.ok()) return refused;
    return absl::InternalError(absl::StrCat(
        "weights v", version, ": torch isfinite flagged tensor '",
        p.info.name, "' but its host copy is finite"));
  }
  return absl::OkStatus();
}

// Step 4: the tree root or the plain SHA-256 of the whole buffer
// (GoLiveDigest).
absl::Status CheckStagedDigest(uint64_t version, const at::Tensor& staged,
                               const DeviceGoLiveOptions& options) {
  const bool has_tree = !options.expected_tree_sha256.empty();
  const bool has_sha256 = !options.expected_sha256.empty();
  bool use_tree = false;
  switch (options.digest) {
    case GoLiveDigest::kAuto:
      use_tree = has_tree && ((staged.is_cuda() && options.tree_sha256) ||
                              !has_sha256);
      break;
    case GoLiveDigest::kTree:
      if (!has_tree) {
        return absl::FailedPreconditionError(absl::StrCat(
            "weights v", version,
            ": the tree digest is required but there is no trusted tree "
            "root (manifest tree_sha256 empty)"));
      }
      use_tree = true;
      break;
    case GoLiveDigest::kSha256:
      break;
  }
  if (!use_tree) {
    if (!has_sha256) return absl::OkStatus();
    return VerifyTensorWeightSha256(version, options.expected_sha256, staged,
                                    options.piece_bytes);
  }
  const auto* base = static_cast<const uint8_t*>(staged.data_ptr());
  const uint64_t size = static_cast<uint64_t>(staged.numel());
  absl::StatusOr<std::string> root;
  if (options.tree_sha256) {
    root = options.tree_sha256(base, size);
  } else if (staged.is_cpu()) {
    root = WeightTreeSha256({base, size});
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "weights v", version, ": no tree digest function for a buffer on ",
        staged.device().str()));
  }
  if (!root.ok()) return root.status();
  return CheckWeightTreeSha256(version, options.expected_tree_sha256, *root,
                               size);
}

}  // namespace

absl::Status VerifyStagedTensor(const v1::WeightManifest& manifest,
                                const FlatWeightLayout& layout,
                                const at::Tensor& staged,
                                const DeviceGoLiveOptions& options) {
  const uint64_t version = manifest.policy_version();
  if (absl::Status s = layout.CheckSameLayout(manifest); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(version, layout, staged); !s.ok()) {
    return s;
  }
  if (options.finite_check == FiniteCheck::kBitScan && !staged.is_cpu()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weights v", version, ": the bit-scan finite check reads host memory, ",
        "the buffer is on ", staged.device().str()));
  }
  if (!options.crc32c && !staged.is_cpu()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weights v", version, ": no CRC-32C function for a buffer on ",
        staged.device().str()));
  }
  const auto* base = static_cast<const uint8_t*>(staged.data_ptr());
  for (int i = 0; i < manifest.buckets_size(); ++i) {
    const v1::BucketSpec& b = manifest.buckets(i);
    uint32_t crc = 0;
    if (options.crc32c) {
      absl::StatusOr<uint32_t> got =
          options.crc32c(base + b.byte_offset(), b.byte_size());
      if (!got.ok()) return got.status();
      crc = *got;
    } else {
      crc = kernels::Crc32c(base + b.byte_offset(), b.byte_size());
    }
    if (crc != b.crc32c()) {
      return absl::DataLossError(
          absl::StrCat("weights v", version, " bucket ", i, ": CRC-32C ", crc,
                       " of the staged bytes, the manifest says ", b.crc32c()));
    }
  }
  try {
    const bool torch =
        options.finite_check == FiniteCheck::kTorch ||
        (options.finite_check == FiniteCheck::kAuto && !staged.is_cpu());
    const absl::Status finite =
        torch ? CheckFiniteOnDevice(version, layout, staged)
              : CheckWeightsFinite(version, layout, {base, layout.total_bytes()});
    if (!finite.ok()) return finite;
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus(
        absl::StrCat("weights v", version, ": finite check"), e);
  }
  return CheckStagedDigest(version, staged, options);
}

absl::StatusOr<std::shared_ptr<model::ModelWeights>> ViewStagedTensor(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    const at::Tensor& staged) {
  if (absl::Status s = CheckBuffer(0, layout, staged); !s.ok()) return s;
  const at::ScalarType dtype = config.dtype == model::WeightDType::kBFloat16
                                   ? at::kBFloat16
                                   : at::kFloat;
  std::map<std::string, at::Tensor> tensors;
  try {
    for (const TensorPlacement& placement : layout.tensors()) {
      if (FloatType(placement.info.dtype) != dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", placement.info.name,
                         "': dtype does not match the config's ",
                         model::WeightDTypeName(config.dtype)));
      }
      // narrow/view share the staged tensor's storage: no copy, and the
      // buffer lives as long as any view.
      tensors.emplace(placement.info.name, View(staged, placement, dtype));
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("viewing the staged weights", e);
  }
  return model::ModelWeights::Create(config, std::move(tensors),
                                     "received weights");
}

absl::StatusOr<std::shared_ptr<model::ModelWeights>> GoLiveFromStagedTensor(
    const model::ModelConfig& config, const v1::WeightManifest& manifest,
    const FlatWeightLayout& layout, const at::Tensor& staged,
    const DeviceGoLiveOptions& options) {
  if (absl::Status s = VerifyStagedTensor(manifest, layout, staged, options);
      !s.ok()) {
    return s;
  }
  return ViewStagedTensor(config, layout, staged);
}

absl::StatusOr<at::Tensor> StagedCopyTensor(const StagedIpcCopy& copy) {
  std::shared_ptr<void> keep = copy.memory;
  void* data = keep.get();
  const at::Device device = copy.device < 0
                                ? at::Device(at::kCPU)
                                : at::Device(at::kCUDA, copy.device);
  try {
    return at::from_blob(
        data, {static_cast<int64_t>(copy.bytes)},
        [keep = std::move(keep)](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(at::kByte).device(device));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("viewing the CUDA IPC copy as a tensor on ", device.str(),
                     ": ", e.what_without_backtrace()));
  }
}

}  // namespace tandem::weights
