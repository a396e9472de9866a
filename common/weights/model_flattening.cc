#include "common/weights/model_flattening.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"

namespace tandem::weights {
namespace {

absl::StatusOr<v1::DType> ToDType(at::ScalarType type,
                                  const std::string& name) {
  switch (type) {
    case at::kFloat:
      return v1::DTYPE_F32;
    case at::kBFloat16:
      return v1::DTYPE_BF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': dtype ", c10::toString(type),
                       " cannot be published (float32 or bfloat16 only)"));
  }
}

}  // namespace

absl::StatusOr<FlatWeightLayout> LayoutForModel(
    const model::ModelWeights& weights, const LayoutOptions& options) {
  std::vector<TensorInfo> infos;
  for (const auto& [name, tensor] : weights.tensors()) {
    TensorInfo info;
    info.name = name;
    ASSIGN_OR_RETURN(info.dtype, ToDType(tensor.scalar_type(), name));
    info.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    info.byte_size = static_cast<uint64_t>(tensor.numel()) *
                     static_cast<uint64_t>(tensor.element_size());
    infos.push_back(std::move(info));
  }
  return FlatWeightLayout::Create(std::move(infos), options);
}

absl::StatusOr<FlatWeightLayout> LayoutForConfig(
    const model::ModelConfig& config, const LayoutOptions& options) {
  const bool bf16 = config.dtype == model::WeightDType::kBFloat16;
  // ModelWeights::tensors() is a name-ordered map; so is this.
  std::map<std::string, TensorInfo> by_name;
  for (const model::ExpectedTensor& expected : model::ExpectedTensors(config)) {
    TensorInfo info;
    info.name = expected.name;
    info.dtype = bf16 ? v1::DTYPE_BF16 : v1::DTYPE_F32;
    info.shape = expected.shape;
    uint64_t numel = 1;
    for (int64_t d : expected.shape) numel *= static_cast<uint64_t>(d);
    info.byte_size = numel * (bf16 ? 2 : 4);
    by_name.emplace(expected.name, std::move(info));
  }
  std::vector<TensorInfo> infos;
  for (auto& [name, info] : by_name) infos.push_back(std::move(info));
  return FlatWeightLayout::Create(std::move(infos), options);
}

absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> FlattenModel(
    const model::ModelWeights& weights, const FlatWeightLayout& layout) {
  auto flat = std::make_shared<std::vector<uint8_t>>(layout.total_bytes(), 0);
  try {
    for (const auto& [name, tensor] : weights.tensors()) {
      ASSIGN_OR_RETURN(absl::Span<uint8_t> dest,
                       layout.TensorBytes(absl::MakeSpan(*flat), name));
      const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
      const uint64_t bytes = static_cast<uint64_t>(cpu.numel()) *
                             static_cast<uint64_t>(cpu.element_size());
      if (bytes != dest.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': ", bytes,
                         " bytes, layout holds ", dest.size()));
      }
      std::memcpy(dest.data(), cpu.data_ptr(), bytes);
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("flattening weights", e);
  }
  return flat;
}

namespace {

// UnflattenModel (`owner` null: copies) and ViewFlatModel (views that hold
// `owner`, whose bytes `flat` are).
absl::StatusOr<std::shared_ptr<model::ModelWeights>> FromFlat(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    absl::Span<const uint8_t> flat,
    const std::shared_ptr<const WeightBuffer>& owner) {
  if (flat.size() != layout.total_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flat buffer has ", flat.size(), " bytes, layout needs ",
                     layout.total_bytes()));
  }
  const at::ScalarType dtype = config.dtype == model::WeightDType::kBFloat16
                                   ? at::kBFloat16
                                   : at::kFloat;
  std::map<std::string, at::Tensor> tensors;
  try {
    for (const TensorPlacement& placement : layout.tensors()) {
      const TensorInfo& info = placement.info;
      if ((dtype == at::kFloat) != (info.dtype == v1::DTYPE_F32)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", info.name, "': dtype does not match the config's ",
            model::WeightDTypeName(config.dtype)));
      }
      // The layout aligns every tensor (>= its element size); the weights
      // are only read, so the const_cast never leads to a write. A view is
      // not read before its size is checked.
      uint8_t* bytes = const_cast<uint8_t*>(flat.data() + placement.offset);
      at::Tensor tensor = owner == nullptr
                              ? at::empty(info.shape, at::TensorOptions(dtype))
                              : at::from_blob(
                                    bytes, info.shape, [owner](void*) {},
                                    at::TensorOptions(dtype));
      if (static_cast<uint64_t>(tensor.numel() * tensor.element_size()) !=
          info.byte_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", info.name, "': size mismatch"));
      }
      if (owner == nullptr) {
        std::memcpy(tensor.data_ptr(), bytes, info.byte_size);
      }
      tensors.emplace(info.name, std::move(tensor));
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("unflattening weights", e);
  }
  return model::ModelWeights::Create(config, std::move(tensors),
                                     "received weights");
}

}  // namespace

absl::StatusOr<std::shared_ptr<model::ModelWeights>> UnflattenModel(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    absl::Span<const uint8_t> flat) {
  return FromFlat(config, layout, flat, nullptr);
}

absl::StatusOr<std::shared_ptr<model::ModelWeights>> ViewFlatModel(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    std::shared_ptr<const WeightBuffer> flat) {
  if (flat == nullptr) {
    return absl::InvalidArgumentError("no flat buffer to view");
  }
  const absl::Span<const uint8_t> bytes = flat->span();
  return FromFlat(config, layout, bytes, flat);
}

}  // namespace tandem::weights
