#include "common/weights/device_go_live.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"
#include "common/weights/tree_digest.h"
#include "kernels/crc32c.h"
#include "kernels/finite_scan.h"

namespace tandem::weights {
namespace {

constexpr char kNonFinitePrefix[] = "non-finite weights: ";

std::optional<at::ScalarType> FloatType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return at::kFloat;
    case v1::DTYPE_BF16:
      return at::kBFloat16;
    default:
      return std::nullopt;
  }
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

// Host memory: the bit-pattern scan of the host path (kernels/
// finite_scan.h), at memory bandwidth, naming the element.
absl::Status CheckFiniteOnHost(uint64_t version, const FlatWeightLayout& layout,
                               const at::Tensor& staged) {
  const auto* base = static_cast<const uint8_t*>(staged.data_ptr());
  for (const TensorPlacement& placement : layout.tensors()) {
    const std::optional<at::ScalarType> dtype = FloatType(placement.info.dtype);
    if (!dtype.has_value()) continue;
    const kernels::FloatFormat format = *dtype == at::kFloat
                                            ? kernels::FloatFormat::kF32
                                            : kernels::FloatFormat::kBF16;
    const std::optional<kernels::NonFiniteValue> bad = kernels::FindNonFinite(
        {base + placement.offset, placement.info.byte_size}, format);
    if (!bad.has_value()) continue;
    return absl::OutOfRangeError(absl::StrCat(
        kNonFinitePrefix, "weights v", version, " tensor '",
        placement.info.name, "' holds Inf or NaN (",
        kernels::NonFiniteName(*bad), " at element ", bad->index, ")"));
  }
  return absl::OkStatus();
}

// Any device: torch isfinite on the tensor's device. One flag per float
// tensor, computed there; the host reads them once for the whole version.
absl::Status CheckFiniteOnDevice(uint64_t version,
                                 const FlatWeightLayout& layout,
                                 const at::Tensor& staged) {
  std::vector<at::Tensor> bad;
  std::vector<const TensorPlacement*> which;
  for (const TensorPlacement& placement : layout.tensors()) {
    const std::optional<at::ScalarType> dtype = FloatType(placement.info.dtype);
    if (!dtype.has_value() || placement.info.byte_size == 0) continue;
    bad.push_back(
        at::logical_not(at::isfinite(View(staged, placement, *dtype))).any());
    which.push_back(&placement);
  }
  if (bad.empty()) return absl::OkStatus();
  const at::Tensor flags = at::stack(bad).to(at::kCPU);
  const bool* flag = flags.data_ptr<bool>();
  for (size_t i = 0; i < which.size(); ++i) {
    if (!flag[i]) continue;
    return absl::OutOfRangeError(
        absl::StrCat(kNonFinitePrefix, "weights v", version, " tensor '",
                     which[i]->info.name, "' holds Inf or NaN"));
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

bool IsNonFiniteWeights(const absl::Status& status) {
  return absl::IsOutOfRange(status) &&
         absl::StartsWith(status.message(), kNonFinitePrefix);
}

absl::Status VerifyStagedTensor(const v1::WeightManifest& manifest,
                                const FlatWeightLayout& layout,
                                const at::Tensor& staged,
                                const DeviceGoLiveOptions& options) {
  const uint64_t version = manifest.policy_version();
  if (absl::Status s = layout.CheckSameLayout(manifest); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(version, layout, staged); !s.ok()) {
    return s;
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
    const absl::Status finite =
        staged.is_cpu() && !options.torch_finite_check_for_test
            ? CheckFiniteOnHost(version, layout, staged)
            : CheckFiniteOnDevice(version, layout, staged);
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

}  // namespace tandem::weights
