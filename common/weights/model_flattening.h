#pragma once

// The bridge between a model's named tensors and the flat, bucketed weight
// buffer that every transport moves: the trainer flattens the weights of a
// new policy version and publishes the bytes with their manifest; a rollout
// worker rebuilds ModelWeights from the bytes it received and verified.
// Tensors are laid out in Hugging Face name order, so both sides derive the
// same layout from the model config alone.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_buffer.h"

namespace tandem::model {
struct ModelConfig;
class ModelWeights;
}  // namespace tandem::model

namespace tandem::weights {

// The layout of `weights` (float32 or bfloat16 tensors).
absl::StatusOr<FlatWeightLayout> LayoutForModel(
    const model::ModelWeights& weights, const LayoutOptions& options = {});

// The layout of weights for `config` in config.dtype, without the weights:
// the same as LayoutForModel of such weights on any device.
absl::StatusOr<FlatWeightLayout> LayoutForConfig(
    const model::ModelConfig& config, const LayoutOptions& options = {});

// A new flat buffer holding every tensor's bytes at its layout offset
// (padding zeroed). REQUIRES: `layout` is LayoutForModel of compatible
// weights; InvalidArgument names a tensor that does not fit.
absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> FlattenModel(
    const model::ModelWeights& weights, const FlatWeightLayout& layout);

// ModelWeights for `config` whose tensors are copies of the bytes in
// `flat` (CPU). InvalidArgument names a tensor missing from the layout or
// of the wrong size or dtype.
absl::StatusOr<std::shared_ptr<model::ModelWeights>> UnflattenModel(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    absl::Span<const uint8_t> flat);

// ModelWeights for `config` whose tensors view the bytes of `flat` (CPU)
// without copying them; each tensor holds a reference to `flat`, which
// therefore lives as long as any of them. The caller must not change the
// bytes while the weights exist (StagingWeights::live_buffer() gives such
// a buffer). Errors as UnflattenModel's.
absl::StatusOr<std::shared_ptr<model::ModelWeights>> ViewFlatModel(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    std::shared_ptr<const WeightBuffer> flat);

}  // namespace tandem::weights
