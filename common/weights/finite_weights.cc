#include "common/weights/finite_weights.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

constexpr char kRefused[] = " refused: tensor '";
constexpr char kNonFinite[] = " holds a non-finite value: element ";

}  // namespace

absl::Status NonFiniteWeightsError(uint64_t version,
                                   const FlatWeightLayout& layout,
                                   size_t tensor,
                                   const kernels::NonFiniteValue& value) {
  const TensorPlacement& t = layout.tensors()[tensor];
  const kernels::FloatFormat format = *FloatFormatOf(t.info.dtype);
  const uint64_t byte =
      t.offset + value.index * kernels::FloatFormatSize(format);
  return absl::DataLossError(
      absl::StrCat("weights v", version, kRefused, t.info.name, "' (",
                   kernels::FloatFormatName(format), ")", kNonFinite,
                   value.index, " is ", kernels::NonFiniteName(value),
                   " (bucket ", byte / layout.bucket_bytes(), ")"));
}

absl::Status CheckTensorPieceFinite(uint64_t version,
                                    const FlatWeightLayout& layout,
                                    size_t tensor, uint64_t offset,
                                    absl::Span<const uint8_t> bytes) {
  const TensorPlacement& t = layout.tensors()[tensor];
  const std::optional<kernels::FloatFormat> format =
      FloatFormatOf(t.info.dtype);
  if (!format.has_value()) return absl::OkStatus();
  std::optional<kernels::NonFiniteValue> bad =
      kernels::FindNonFinite(bytes, *format);
  if (!bad.has_value()) return absl::OkStatus();
  bad->index += (offset - t.offset) / kernels::FloatFormatSize(*format);
  return NonFiniteWeightsError(version, layout, tensor, *bad);
}

absl::Status CheckWeightsFinite(uint64_t version,
                                const FlatWeightLayout& layout,
                                absl::Span<const uint8_t> flat) {
  const std::vector<TensorPlacement>& tensors = layout.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (absl::Status s = CheckTensorPieceFinite(
            version, layout, t, tensors[t].offset,
            flat.subspan(tensors[t].offset, tensors[t].info.byte_size));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

bool IsNonFiniteWeights(const absl::Status& status) {
  return absl::IsDataLoss(status) &&
         absl::StrContains(status.message(), kRefused) &&
         absl::StrContains(status.message(), kNonFinite);
}

}  // namespace tandem::weights
