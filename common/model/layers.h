#pragma once

// The numeric building blocks of the decoder, written to match Hugging Face
// transformers' eager Llama/Qwen2/Qwen3 code operation for operation (same
// dtypes at each step), so that logits agree with it to rounding.
// Internal to common/model; callers hold the LibTorch exception contract
// (these functions may throw c10::Error).

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

#include "common/model/model_config.h"

namespace tandem::model::internal {

// weight * (x / sqrt(mean(x^2) + eps)), the normalisation computed in
// float32 and cast back to x's dtype before the weight multiply. Normalises
// over the last dimension.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// How Linear multiplies (DecoderModel picks one per call, see LinearMode in
// decoder_model.h):
//  * kLinear: at::linear, x @ w^T. On the CPU, MKL copies (packs) the
//    large operand w into its own layout on every call.
//  * kWeightLeft: the same product as (w @ x^T)^T, which MKL packs more
//    cheaply for few rows: 1.1-1.5x faster for 2-32 rows at 2 threads.
//  * kRowKernel: kernels::RowGemmF32 on float32 CPU tensors (no packing at
//    all; 1.7x faster than kWeightLeft at 32 rows with AVX-512; with AVX2
//    1.1-1.9x at 8-48 rows in the engine, quiet machine), outside
//    autograd only; elsewhere, or on a CPU with neither
//    AVX-512F nor AVX2 + FMA, it falls back to kWeightLeft.
// Same values up to float32 summation order.
enum class LinearForm : int { kLinear, kWeightLeft, kRowKernel };

// The form LinearMode::kAuto takes for float32 CPU weights and a call of
// `rows` rows (see layers.cc for the measurements): kRowKernel for 2 to
// kWeightLeftMaxRows (48) rows where the row kernel runs on AVX-512 and
// for 1 to 48 on AVX2, kWeightLeft for 2 to 48 on a CPU without either,
// kLinear otherwise.
LinearForm AutoLinearForm(int64_t rows);

// x [T, in] @ w^T (+ bias): w [out, in] as stored, bias [out] or undefined.
// kWeightLeft and kRowKernel need a 2-D x. Differentiable except through
// the row kernel (which is used only when no gradient is wanted).
at::Tensor Linear(const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor& bias, LinearForm form);

// RoPE inverse frequencies [head_dim / 2], float32 on the CPU:
// 1 / theta^(2i / head_dim), with Llama-3 scaling applied when configured
// (long wavelengths divided by `factor`, short ones kept, the band in
// between interpolated smoothly).
at::Tensor RopeInverseFrequencies(const ModelConfig& config);

// cos and sin [T, head_dim] of `positions` [T] (int64), computed in float32
// and returned in `dtype` on the positions' device. `inv_freq` comes from
// RopeInverseFrequencies (any device).
std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq,
                                             const at::Tensor& positions,
                                             at::ScalarType dtype);

// Rotates x [T, heads, head_dim] by cos/sin [T, head_dim] in the
// "rotate_half" layout (first and second halves of each head pair up).
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos,
                     const at::Tensor& sin);

// Grouped-query causal attention of one sequence. q [n, heads, head_dim]
// holds the queries of the last n of the L tokens whose keys and values are
// k, v [kv_heads, L, head_dim]; query i sees keys [0, L - n + i]. Query
// head h uses kv head h / (heads / kv_heads). Scores are scaled by
// `scale`, softmax runs in float32. Returns [n, heads * head_dim].
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, double scale);

// The same attention for B sequences at once: qs[b] [n_b, heads, head_dim]
// are the last n_b of the L_b tokens whose keys and values are ks[b],
// vs[b] [L_b, kv_heads, head_dim] (any strides). Pads queries to max n_b
// and keys to max L_b, masks padding and the future, and runs one batched
// matmul pair: a few dozen ops in all instead of a dozen per sequence, at
// the price of copying keys and values and of the padded work. Returns
// [sum n_b, heads * head_dim], sequences in order. Padded query rows see
// real keys, so no NaN reaches the backward pass.
at::Tensor PaddedCausalAttention(const std::vector<at::Tensor>& qs,
                                 const std::vector<at::Tensor>& ks,
                                 const std::vector<at::Tensor>& vs,
                                 double scale);

// PaddedCausalAttention for a packed batch of whole sequences (the training
// shape, n_b == L_b): q [T, heads, head_dim] and k, v [T, kv_heads,
// head_dim] hold the B sequences back to back, sequence b in `lengths[b]`
// rows. The same values, bit for bit, as PaddedCausalAttention over the
// sequences' narrow views, forward and backward; but it pads each tensor
// with one index_copy, so its backward is one gather per tensor. Through
// per-sequence views, autograd cloned the whole padded gradient once per
// sequence (pad_sequence's copies into views) and summed one zero-padded
// gradient per view: B times the batch's size per tensor and layer.
at::Tensor PackedPaddedCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v,
                                       const std::vector<int64_t>& lengths,
                                       double scale);

}  // namespace tandem::model::internal
