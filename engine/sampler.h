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
// with at least one finite.
SampledToken SampleToken(const float* logits, int32_t vocab_size,
                         const SamplingParams& params, std::mt19937_64* rng);

}  // namespace tandem::engine
