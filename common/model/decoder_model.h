#pragma once

// The decoder-only transformer shared by the trainer and the rollout worker
// (Llama, Qwen2, Qwen3; see model_config.h), so both compute exactly the
// same function of the same ModelWeights.
//
// Two ways in:
//  * Training: ForwardPackedHidden / ForwardPacked over packed
//    variable-length sequences, autograd-friendly: call requires_grad_(true)
//    on the tensors of weights()->tensors() (the very tensors the layers
//    use) and gradients flow to them; an optimizer updates them in place.
//  * Inference: ForwardWithCache (and its shorthands Prefill and
//    DecodeStep) appends tokens to per-sequence KvCaches and returns the
//    next-token logits. Runs under c10::InferenceMode, so the returned
//    logits are inference tensors (not usable in autograd).
//
// Attention over several sequences (packed training input, or a batch of
// cached sequences) never crosses sequences. Projections, norms and the
// MLP run on all tokens at once ([T, hidden] matrices); attention has two
// strategies, chosen per call by a cost estimate (AttentionMode::kAuto):
//  * per sequence: a dense causal [n x L] problem each, reading the cache
//    in place; no wasted work, but a dozen small ops per sequence and
//    layer (~50 us on CPU), which dominates for small models and batches
//    of short sequences;
//  * padded: queries and keys padded to the longest sequence, one batched
//    matmul pair with a mask; constant op count, but it copies the keys
//    and values and computes the padding. With paged caches of one pool
//    (paged_kv_cache.h) the copy is one gather for the whole batch and the
//    attention one scaled_dot_product_attention (PagedBatch); on a
//    decode-only step over a pool whose decode_kernel() is set, PagedBatch
//    reads the blocks in place instead (paged_attention.h), whatever the
//    cost estimate says.
// Both beat one block-diagonal [T x T] mask over the packed tokens, which
// wastes T^2 - sum n_i^2 work (98% of it for 64 equal sequences).
//
// Numerics follow transformers' eager implementation: RMSNorm and softmax
// in float32, everything else in the weights' dtype; logits are computed
// in the weights' dtype (hidden @ lm_head^T) and returned as float32 by the
// inference entry points.
//
// Thread safety: the forward methods are const and may run concurrently
// (e.g. a trainer's evaluation thread) as long as no two calls use the same
// KvCache. SwapWeights may be called at any time from any thread: a call
// already running finishes on the weights it started with, the next one
// uses the new ones; an engine that wants one version per step simply
// swaps between its steps. Changing the live weights' values in place
// (ModelWeights::CopyValuesFrom, the memory-saving mode) is only safe
// between steps, with no call running. Swapping between the steps of a
// sequence is the caller's policy decision (PipelineRL keeps the KV cache
// of the old weights); the model does not track which weights filled a
// cache.

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem::model {
namespace internal {
enum class LinearForm : int;  // layers.h
}  // namespace internal
class PagedBatch;  // paged_kv_cache.h

// One sequence's share of a cached forward step: `tokens` (at least one)
// are appended to `cache` at positions cache->num_tokens(),
// cache->num_tokens() + 1, ...; the sequence's earlier tokens are read from
// the cache. Both are borrowed for the call.
struct SequenceStep {
  absl::Span<const int32_t> tokens;
  KvCache* cache = nullptr;
};

// Attention strategy over several sequences (see the file comment).
enum class AttentionMode { kAuto, kPerSequence, kPadded };

// How projections and the LM head multiply by a weight w [out, in]
// (internal::LinearForm in layers.h): kLinear = at::linear (x @ w^T);
// kWeightLeft = (w @ x^T)^T, which on the CPU makes MKL's per-call copy of
// w cheaper; kRowKernel = kernels::RowGemmF32, no copy at all (float32 on
// the CPU outside autograd, else as kWeightLeft); kAuto = for float32
// weights on the CPU, internal::AutoLinearForm(rows): the row kernel or the
// weight-left form for decode steps up to kWeightLeftMaxRows rows, by the
// CPU's vector path and the row count; kLinear otherwise (one row on
// AVX-512, where at::linear was as fast; prefill; training; bfloat16, not
// measured; GPUs, where nothing is repacked).
enum class LinearMode { kAuto, kLinear, kWeightLeft, kRowKernel };
inline constexpr int64_t kWeightLeftMaxRows = 48;

struct DecoderOptions {
  AttentionMode attention = AttentionMode::kAuto;
  LinearMode linear = LinearMode::kAuto;
};

class DecoderModel {
 public:
  // REQUIRES: weights != nullptr.
  explicit DecoderModel(std::shared_ptr<ModelWeights> weights,
                        DecoderOptions options = {});

  DecoderModel(const DecoderModel&) = delete;
  DecoderModel& operator=(const DecoderModel&) = delete;

  // The weights the next forward call will use.
  std::shared_ptr<ModelWeights> weights() const { return weights_.load(); }

  // Makes `next` the live weights and returns the previous ones (which stay
  // alive while a running call or the caller holds them). `next` must have
  // the same architecture and shapes (ExpectedTensors equal), RoPE
  // parameters, dtype and device; InvalidArgument otherwise, and nothing
  // changes. The swap is a pointer exchange: load the new version into
  // `next` beforehand.
  absl::StatusOr<std::shared_ptr<ModelWeights>> SwapWeights(
      std::shared_ptr<ModelWeights> next);

  // ---- Training ----

  // Final hidden states [T, hidden] (after the last RMSNorm, before the LM
  // head) of packed sequences:
  //   input_ids     [T] int64, token ids in [0, vocab_size)
  //   position_ids  [T] int64, usually restarting at 0 for each sequence
  //   cu_seqlens    [B + 1] int64 (or int32), 0 = c_0 < c_1 < ... < c_B = T;
  //                 sequence b is tokens [c_b, c_{b+1})
  // Attention is causal within each sequence and never crosses sequences.
  // Any device; the tensors are moved to the weights' device (cu_seqlens is
  // read on the CPU). InvalidArgument for inconsistent shapes or ids.
  absl::StatusOr<at::Tensor> ForwardPackedHidden(
      const at::Tensor& input_ids, const at::Tensor& position_ids,
      const at::Tensor& cu_seqlens) const;

  // Logits [T, vocab] in the weights' dtype: LmHead(ForwardPackedHidden()).
  // Materialises T x vocab values; for long batches prefer the hidden
  // states plus a chunked log-prob kernel.
  absl::StatusOr<at::Tensor> ForwardPacked(const at::Tensor& input_ids,
                                           const at::Tensor& position_ids,
                                           const at::Tensor& cu_seqlens) const;

  // hidden [..., hidden] @ lm_head^T, in the weights' dtype.
  absl::StatusOr<at::Tensor> LmHead(const at::Tensor& hidden) const;

  // ---- Inference ----

  // Appends each step's tokens to its cache (see kv_cache.h for the
  // protocol; this method calls Reserve, Store, Read and Commit) and
  // returns float32 logits [B, vocab] for the last token of each step, or
  // with `all_logits` [sum of tokens, vocab] for every token in order.
  // Steps may mix prefills (many tokens) and decodes (one token). Each
  // cache must appear once. On error no cache's num_tokens() changes.
  absl::StatusOr<at::Tensor> ForwardWithCache(
      absl::Span<const SequenceStep> steps, bool all_logits = false) const;

  // Prompt (or chunk) `tokens` appended to `cache`: float32 logits [vocab]
  // of the token after them.
  absl::StatusOr<at::Tensor> Prefill(absl::Span<const int32_t> tokens,
                                     KvCache* cache) const;

  // One new token per sequence: tokens[b] is appended to caches[b] (the
  // sequences may have any, different lengths). Returns float32 logits
  // [B, vocab].
  absl::StatusOr<at::Tensor> DecodeStep(
      absl::Span<const int32_t> tokens,
      absl::Span<KvCache* const> caches) const;

  // A decode step (one token per sequence) that neither copies from the
  // host nor synchronises with it, so that it can be captured into a CUDA
  // graph and replayed (engine/decode_graphs.h): ids and positions [B]
  // int64 on `w`'s device, keys and values stored and read through `batch`
  // (PagedBatch::ForDecode), `inv_freq` = rope_inverse_frequencies() on
  // that device. Returns float32 logits [B, vocab]. No checks (the caller
  // prepared every input); runs under c10::InferenceMode. May throw
  // c10::Error.
  at::Tensor DecodeOnDevice(const ModelWeights& w, const at::Tensor& inv_freq,
                            const at::Tensor& ids, const at::Tensor& positions,
                            const PagedBatch& batch) const;

  // RoPE inverse frequencies (float32, on the CPU).
  const at::Tensor& rope_inverse_frequencies() const { return inv_freq_; }

 private:
  // Whether attention over sequences with `n` new tokens each and `length`
  // tokens in all each should be padded into one batch.
  absl::StatusOr<at::Tensor> PackedHidden(const ModelWeights& weights,
                                          const at::Tensor& input_ids,
                                          const at::Tensor& position_ids,
                                          const at::Tensor& cu_seqlens) const;

  // How a product with `rows` rows on `weights` is computed
  // (options_.linear resolved).
  internal::LinearForm FormFor(const ModelWeights& weights, int64_t rows) const;

  // `paged`: the caches are PagedKvCaches of one pool, which the padded
  // strategy stores and gathers for the whole batch at once.
  bool UsePaddedAttention(const ModelConfig& config, int64_t element_size,
                          const std::vector<int64_t>& n,
                          const std::vector<int64_t>& length,
                          bool paged) const;

  const DecoderOptions options_;
  // RoPE inverse frequencies (float32, CPU); SwapWeights keeps them valid
  // by refusing weights with other RoPE parameters.
  const at::Tensor inv_freq_;
  std::atomic<std::shared_ptr<ModelWeights>> weights_;
};

}  // namespace tandem::model
