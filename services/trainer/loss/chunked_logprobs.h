#pragma once

// Per-token log-probabilities of the sampled tokens, computed from the final
// hidden states and the LM head without materialising the [T, vocab] logits.
//
// The forward pass walks token chunks and vocabulary chunks with an online
// log-sum-exp; the backward pass (a custom autograd function) recomputes each
// [chunk_tokens, chunk_vocab] block of logits, forms (onehot - softmax) for
// it and accumulates grad_hidden and grad_lm_head. Peak extra memory is a few
// blocks of chunk_tokens x chunk_vocab floats plus the float32 gradient
// accumulators, independent of T x vocab.
//
// The ops are device-generic ATen calls, so CUDA tensors work. On a CUDA
// device the fused kernel of kernels/cuda (online log-sum-exp over the
// vocabulary, backward from the saved log-sum-exp) computes the log-probs
// and their gradients instead, when the build has CUDA
// (TokenLogProbsKernel::kAuto); the entropy statistic, when asked for,
// then comes from one extra no-grad pass of the chunked ATen forward.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace tandem::trainer {

enum class TokenLogProbsKernel {
  // kCuda for CUDA tensors in a build with CUDA, kAten otherwise.
  kAuto,
  // The chunked ATen implementation (any device).
  kAten,
  // kernels/cuda (CUDA tensors only; FailedPrecondition otherwise).
  kCuda,
};

struct TokenLogProbsOptions {
  TokenLogProbsKernel kernel = TokenLogProbsKernel::kAuto;
  // Tokens per block; > 0. Need not divide T. The default block of 2048 x
  // 8192 float32 logits is 64 MiB; the forward and backward passes hold
  // about three such blocks at a time.
  int64_t chunk_tokens = 2048;
  // Vocabulary rows per block; > 0. Need not divide vocab.
  int64_t chunk_vocab = 8192;
  // Logits are (hidden @ lm_head^T) / temperature; > 0. Use the rollout
  // sampler's temperature so that new and behavior log-probs are comparable.
  double temperature = 1.0;
  // Also return the entropy of each token's distribution (one extra
  // multiply-and-sum over each block in the forward pass; no gradient).
  bool compute_entropy = true;
};

struct TokenLogProbs {
  // [T] float32: log softmax(logits[t])[targets[t]]. Differentiable with
  // respect to hidden and lm_head.
  at::Tensor logprobs;
  // [T] float32, detached; undefined unless options.compute_entropy.
  at::Tensor entropy;
};

// hidden [T, H] and lm_head [V, H] (floating, same device; any float dtype,
// arithmetic is float32), targets [T] integral with values in [0, V).
// Returns InvalidArgument on shape, dtype or range errors and
// ResourceExhausted/Internal when LibTorch fails. Gradients flow to hidden
// and lm_head if they require grad; they are returned in their own dtypes.
absl::StatusOr<TokenLogProbs> ComputeTokenLogProbs(
    const at::Tensor& hidden, const at::Tensor& lm_head,
    const at::Tensor& targets, const TokenLogProbsOptions& options);

// Reference implementation: full float32 logits and log_softmax, autograd
// through ATen. Materialises [T, V]; for tests and benchmarks only.
absl::StatusOr<TokenLogProbs> ComputeTokenLogProbsNaive(
    const at::Tensor& hidden, const at::Tensor& lm_head,
    const at::Tensor& targets, const TokenLogProbsOptions& options);

}  // namespace tandem::trainer
