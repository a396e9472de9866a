#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace tandem::engine {

SampledToken SampleToken(const float* logits, int32_t vocab_size,
                         const SamplingParams& params, std::mt19937_64* rng) {
  double u = 0.0;
  if (params.temperature > 0.0f) {
    u = std::uniform_real_distribution<double>(0.0, 1.0)(*rng);
  }
  return SampleTokenWithUniform(logits, vocab_size, params, u);
}

SampledToken SampleTokenWithUniform(const float* logits, int32_t vocab_size,
                                    const SamplingParams& params, double u) {
  const bool greedy = params.temperature <= 0.0f;
  const double inv_t = greedy ? 1.0 : 1.0 / params.temperature;
  // log-sum-exp of the scaled logits, for the log-probability.
  double max_scaled = -std::numeric_limits<double>::infinity();
  int32_t argmax = 0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const double s = logits[i] * inv_t;
    if (s > max_scaled) {
      max_scaled = s;
      argmax = i;
    }
  }
  double sum = 0.0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    sum += std::exp(logits[i] * inv_t - max_scaled);
  }
  const double log_z = max_scaled + std::log(sum);
  auto logprob_of = [&](int32_t token) {
    return static_cast<float>(logits[token] * inv_t - log_z);
  };
  if (greedy) return {argmax, logprob_of(argmax)};

  const bool truncate =
      (params.top_k > 0 && params.top_k < vocab_size) || params.top_p < 1.0f;
  if (!truncate) {
    // Inverse-CDF over the full distribution.
    double left = u * sum;
    for (int32_t i = 0; i < vocab_size; ++i) {
      left -= std::exp(logits[i] * inv_t - max_scaled);
      if (left <= 0.0) return {i, logprob_of(i)};
    }
    return {argmax, logprob_of(argmax)};
  }
  // Candidates sorted by probability, cut by top-k then top-p.
  std::vector<int32_t> order(vocab_size);
  std::iota(order.begin(), order.end(), 0);
  int32_t k =
      params.top_k > 0 ? std::min(params.top_k, vocab_size) : vocab_size;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  order.resize(k);
  std::vector<double> probs(k);
  for (int32_t i = 0; i < k; ++i) {
    probs[i] = std::exp(logits[order[i]] * inv_t - log_z);
  }
  if (params.top_p < 1.0f) {
    double cumulative = 0.0;
    int32_t keep = 0;
    while (keep < k) {
      cumulative += probs[keep++];
      if (cumulative >= params.top_p) break;
    }
    probs.resize(keep);
    order.resize(keep);
  }
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  double left = u * total;
  for (size_t i = 0; i < probs.size(); ++i) {
    left -= probs[i];
    if (left <= 0.0) return {order[i], logprob_of(order[i])};
  }
  return {order.front(), logprob_of(order.front())};
}

}  // namespace tandem::engine
