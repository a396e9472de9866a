#pragma once

// Token sampling from one row of logits: temperature, top-k, top-p, greedy,
// with the sequence's own seeded generator.
//
// The returned log-probability is that of the chosen token under the
// temperature-scaled distribution over the whole vocabulary
// (log_softmax(logits / T); T = 0 uses T = 1), before top-k/top-p
// truncation. That is the distribution the trainer recomputes, so the
// importance ratio is exact when top_k = 0 and top_p = 1 (the RL default).

#include <cstdint>
#include <random>

#include "engine/sequence.h"

namespace tandem::engine {

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
};

// REQUIRES: vocab_size > 0; logits has vocab_size finite-or-(-inf) values
// with at least one finite. Draws one uniform number from `rng` unless the
// sampling is greedy (temperature 0), then SampleTokenWithUniform.
SampledToken SampleToken(const float* logits, int32_t vocab_size,
                         const SamplingParams& params, std::mt19937_64* rng);

// The same with the uniform draw `u` in [0, 1) given (ignored when greedy):
// the candidates (all tokens, or the top-k then top-p ones, sorted by
// logit with ties by id) are walked in order and the first whose
// cumulative probability reaches u times their total is chosen (inverse
// CDF). A model that samples on its device (EngineModel::ForwardSample)
// follows exactly this rule, so the two agree up to rounding.
SampledToken SampleTokenWithUniform(const float* logits, int32_t vocab_size,
                                    const SamplingParams& params, double u);

}  // namespace tandem::engine
