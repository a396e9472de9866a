#pragma once

// Sampling on the logits' device: the rule of SampleTokenWithUniform
// (engine/sampler.h) in tensor operations, so that a rollout worker on a GPU
// copies only the chosen ids and their log-probs to the host, never the
// [rows, vocab] logits. Part of the engine's LibTorch adapter
// (torch_engine_model.cc).

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine_model.h"

namespace tandem::engine {

// logits: [requests.size(), vocab] floating, any device. Row r is sampled
// with requests[r] (temperature, top-k, top-p and its uniform draw): greedy
// rows take the argmax; the others the first candidate whose cumulative
// probability reaches uniform times the candidates' total, the candidates
// being the whole vocabulary or the top-k then top-p tokens sorted by logit
// (ties by id). The log-prob is the chosen token's under log_softmax(logits /
// T) over the whole vocabulary, as on the host. Scaled logits are float32
// and the cumulative sums double, so the host and the device agree except
// when a draw falls within rounding of a boundary.
absl::StatusOr<std::vector<SampledToken>> SampleRows(
    const at::Tensor& logits, const std::vector<SampleRequest>& requests);

}  // namespace tandem::engine
