#pragma once

// CUDA version of the chunked token log-probs of
// services/trainer/loss/chunked_logprobs.h (compiled only with
// TANDEM_ENABLE_CUDA): each token's log-prob of its target under
// softmax(hidden @ lm_head^T / temperature), by an online log-sum-exp over
// the vocabulary, so no [T, V] logits are ever stored; the backward pass
// recomputes the logits from the saved log-sum-exp. Float32 throughout.
//
// All pointers named d_* are device pointers, row-major: hidden [T, H],
// lm_head [V, H], targets [T] with values in [0, V) (callers validate them
// on the host). Functions enqueue work on `stream` (nullptr = the default
// stream) and synchronise it before returning. Thread-safe as far as the
// CUDA runtime is.

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// d_logprobs[t] = logit[t, target_t] - lse_t and d_lse[t] = lse_t, where
// logit = hidden @ lm_head^T / temperature and lse_t = log sum_v
// exp(logit[t, v]). REQUIRES: temperature > 0, T, H, V >= 0.
absl::Status TokenLogProbsForward(const float* d_hidden, const float* d_lm_head,
                                  const int64_t* d_targets, int64_t num_tokens,
                                  int64_t hidden_size, int64_t vocab_size,
                                  float temperature, float* d_logprobs,
                                  float* d_lse, void* stream = nullptr);

// Gradients of sum_t d_grad_logprobs[t] * logprob_t, given the d_lse of
// the forward pass: with p = softmax(logit[t]) and g = d_grad_logprobs[t],
//   d_grad_hidden[t]  = g / temperature * (lm_head[target_t] - p @ lm_head)
//   d_grad_lm_head[v] = sum_t g / temperature * (1[v = target_t] - p_v)
//                                              * hidden[t]
// Both outputs are overwritten.
absl::Status TokenLogProbsBackward(
    const float* d_hidden, const float* d_lm_head, const int64_t* d_targets,
    const float* d_lse, const float* d_grad_logprobs, int64_t num_tokens,
    int64_t hidden_size, int64_t vocab_size, float temperature,
    float* d_grad_hidden, float* d_grad_lm_head, void* stream = nullptr);

}  // namespace tandem::kernels::cuda
