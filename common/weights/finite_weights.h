#pragma once

// The finite check every weights path runs before a version goes live (the
// host staging buffer of StagingWeights, a staged tensor of
// device_go_live.h): a float tensor holding an infinity or a NaN refuses
// the whole version. One scan (kernels::FindNonFinite over host bytes) and
// one refusal, whichever path found the value:
//
//   DataLoss "weights v7 refused: tensor 'lm_head.weight' (BF16) holds a
//   non-finite value: element 2047 is NaN (bucket 3)"
//
// where the element is counted from the tensor's start and the bucket is
// the one holding that element. IsNonFiniteWeights() recognises it.
//
// All functions are thread-safe and do not allocate on success.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/weights/flat_weight_layout.h"
#include "kernels/finite_scan.h"

namespace tandem::weights {

// The refusal above for `value` (its index counted in elements from the
// start of tensor `tensor` of `layout`) of version `version`.
// REQUIRES: tensor < layout.tensors().size() and a float dtype
// (FloatFormatOf has a value).
absl::Status NonFiniteWeightsError(uint64_t version,
                                   const FlatWeightLayout& layout,
                                   size_t tensor,
                                   const kernels::NonFiniteValue& value);

// Scans `bytes` (host memory): the piece of tensor `tensor` that sits at
// `offset` of the version's flat buffer laid out by `layout`, starting at
// one of its elements. The refusal above for the first non-finite element;
// OK when all are finite or the dtype is not a float.
absl::Status CheckTensorPieceFinite(uint64_t version,
                                    const FlatWeightLayout& layout,
                                    size_t tensor, uint64_t offset,
                                    absl::Span<const uint8_t> bytes);

// Every float tensor of `flat` (layout.total_bytes() bytes of host memory),
// in layout order: the refusal above for the first non-finite element.
absl::Status CheckWeightsFinite(uint64_t version,
                                const FlatWeightLayout& layout,
                                absl::Span<const uint8_t> flat);

// True for the refusal above.
bool IsNonFiniteWeights(const absl::Status& status);

}  // namespace tandem::weights
