#include "common/model/layers.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/base/range_pool.h"
#include "kernels/row_gemm.h"

namespace tandem::model::internal {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor normed = x32 * at::rsqrt(variance + eps);
  return weight * normed.to(x.scalar_type());
}

// The row range of kAuto's row kernel, from decode steps of a random
// Qwen2.5-0.5B-shaped model (docs/benchmarks.md, generation section):
//  * AVX-512 (session 21): it beat the weight-left form at 8 and 32 rows and
//    tied at::linear at one row, so one row keeps at::linear. Those runs
//    had the kernel on one thread (at::parallel_for, below) against MKL on
//    two; not measured since.
//  * AVX2 + FMA (session 22, AVX2-only EPYC, 2 threads, quiet machine,
//    after the kernel got its second thread): 1.13-1.46x the weight-left
//    form at 16-48 rows, 1.9x at 8, 1.39x at::linear at one row.
// All stop at 48 rows: above come prefill chunks, where MKL's blocking wins
// (at 128 rows the AVX2 kernel only tied the weight-left form).
LinearForm AutoLinearForm(int64_t rows) {
  if (rows < 1 || rows > 48) return LinearForm::kLinear;
  switch (kernels::RowGemmF32Path()) {
    case kernels::RowGemmPath::kAvx512:
      return rows >= 2 ? LinearForm::kRowKernel : LinearForm::kLinear;
    case kernels::RowGemmPath::kAvx2:
      return LinearForm::kRowKernel;
    case kernels::RowGemmPath::kPortable:
      break;
  }
  return rows >= 2 ? LinearForm::kWeightLeft : LinearForm::kLinear;
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor& bias, LinearForm form) {
  if (form == LinearForm::kLinear) return at::linear(x, w, bias);
  const bool wants_grad =
      at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() ||
                                     (bias.defined() && bias.requires_grad()));
  if (form == LinearForm::kRowKernel && !wants_grad &&
      kernels::RowGemmF32Fast() && x.device().is_cpu() && w.device().is_cpu() &&
      x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
      w.is_contiguous() && x.dim() == 2) {
    const at::Tensor xc = x.contiguous();
    const int64_t m = xc.size(0), k = xc.size(1), n = w.size(0);
    at::Tensor y = at::empty({m, n}, xc.options());
    const float* xp = xc.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // Column ranges (kernels::RowGemmParts), one per thread, on the shared
    // pool's threads (the calling thread takes the last). Not
    // at::parallel_for: it is a header template whose OpenMP pragma is
    // compiled into the caller, and this project compiles without -fopenmp
    // (one OpenMP runtime, LibTorch's), so it ran every range on the
    // calling thread (row_gemm_bench's "pf" path, docs/benchmarks.md). Not
    // a std::thread per call: about 170 calls a decode step
    // (common/base/range_pool.h).
    RangePool& pool = RangePool::Shared();
    const int64_t parts = kernels::RowGemmParts(
        n, std::min<int64_t>(at::get_num_threads(), pool.max_parallel()));
    pool.Run(static_cast<int>(parts), [&](int part) {
      const kernels::ColumnRange c = kernels::RowGemmColumns(n, parts, part);
      kernels::RowGemmF32(xp, wp, yp, m, n, k, c.begin, c.end);
    });
    if (bias.defined()) y.add_(bias);
    return y;
  }
  const at::Tensor product = bias.defined()
                                 ? at::addmm(bias.unsqueeze(1), w, x.t())
                                 : at::mm(w, x.t());
  return product.t().contiguous();
}

at::Tensor RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  const at::Tensor exponents =
      at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong))
          .to(at::kFloat) /
      static_cast<double>(dim);
  at::Tensor inv_freq =
      1.0 /
      at::pow(at::scalar_tensor(config.rope_theta, at::kFloat), exponents);
  if (!config.rope_scaling.has_value()) return inv_freq;
  const RopeScaling& s = *config.rope_scaling;
  const double old_context =
      static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const at::Tensor wavelen = 2.0 * M_PI / inv_freq;
  at::Tensor scaled =
      at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth = (old_context / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed =
      (1.0 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor is_medium =
      at::logical_not(wavelen < high_freq_wavelen)
          .logical_and(at::logical_not(wavelen > low_freq_wavelen));
  return at::where(is_medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq,
                                             const at::Tensor& positions,
                                             at::ScalarType dtype) {
  const at::Tensor freqs =
      positions.to(at::kFloat).unsqueeze(1) *
      inv_freq.to(positions.device()).unsqueeze(0);  // [T, head_dim / 2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos,
                     const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated =
      at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  // cos/sin [T, D] broadcast over heads.
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, double scale) {
  const int64_t n = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const int64_t length = k.size(1);
  // LibTorch's fused attention: [1, heads, n, dim] queries against
  // [1, kv_heads, length, dim] keys and values, query head h reading kv head
  // h / (heads / kv_heads) (enable_gqa), softmax accumulated in float32.
  const at::Tensor query = q.permute({1, 0, 2}).unsqueeze(0);
  std::optional<at::Tensor> visible;
  bool causal = false;
  if (n == length) {
    causal = n > 1;  // a whole prompt: the usual lower triangle
  } else if (n > 1) {
    // Query i (at position length - n + i) sees keys up to its position.
    const auto long_options =
        at::TensorOptions().dtype(at::kLong).device(q.device());
    const at::Tensor key_pos = at::arange(length, long_options);
    const at::Tensor query_pos = at::arange(length - n, length, long_options);
    visible = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1);
  }
  const at::Tensor out = at::scaled_dot_product_attention(
      query, k.unsqueeze(0), v.unsqueeze(0), visible, /*dropout_p=*/0.0,
      causal, scale, /*enable_gqa=*/true);  // [1, heads, n, dim]
  return out.squeeze(0).permute({1, 0, 2}).reshape({n, heads * dim});
}

namespace {

// Attention over padded batches: q [B, max_n, heads, head_dim] and k, v
// [B, max_length, kv_heads, head_dim], sequence b's query i at position
// offset[b] + i of its length[b] keys. Returns [B * max_n, heads * head_dim]
// with the padded query rows (which see every real key) included.
at::Tensor AttendPadded(const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& length, double scale) {
  const int64_t batch = q.size(0);
  const int64_t max_n = q.size(1);
  const int64_t heads = q.size(2);
  const int64_t dim = q.size(3);
  const int64_t max_length = k.size(1);
  const int64_t kv_heads = k.size(2);
  const int64_t group = heads / kv_heads;
  // [B, kv_heads, group * max_n, dim]
  const at::Tensor qg = q.view({batch, max_n, kv_heads, group, dim})
                            .permute({0, 2, 3, 1, 4})
                            .reshape({batch, kv_heads, group * max_n, dim});
  at::Tensor scores = at::matmul(qg, k.permute({0, 2, 3, 1})) * scale;
  // Key j is visible to query i of sequence b iff j <= offset_b + i and
  // j < length_b; for padded rows (i >= n_b) that is every real key.
  const auto long_options =
      at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor key_pos =
      at::arange(max_length, long_options).view({1, 1, -1});
  const at::Tensor query_idx = at::arange(max_n, long_options).view({1, -1, 1});
  const at::Tensor offsets =
      at::tensor(offset, at::kLong).to(q.device()).view({-1, 1, 1});
  const at::Tensor lengths =
      at::tensor(length, at::kLong).to(q.device()).view({-1, 1, 1});
  const at::Tensor hidden =
      (key_pos > offsets + query_idx).logical_or(key_pos >= lengths);
  scores = scores.view({batch, kv_heads, group, max_n, max_length})
               .masked_fill(hidden.unsqueeze(1).unsqueeze(1),
                            -std::numeric_limits<float>::infinity())
               .view({batch, kv_heads, group * max_n, max_length});
  const at::Tensor probs =
      at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, v.permute({0, 2, 1, 3}))
      .view({batch, kv_heads, group, max_n, dim})
      .permute({0, 3, 1, 2, 4})
      .reshape({batch * max_n, heads * dim});
}

}  // namespace

at::Tensor PaddedCausalAttention(const std::vector<at::Tensor>& qs,
                                 const std::vector<at::Tensor>& ks,
                                 const std::vector<at::Tensor>& vs,
                                 double scale) {
  const int64_t batch = static_cast<int64_t>(qs.size());
  std::vector<int64_t> n(batch), offset(batch), length(batch);
  int64_t max_n = 0;
  for (int64_t b = 0; b < batch; ++b) {
    n[b] = qs[b].size(0);
    length[b] = ks[b].size(0);
    offset[b] = length[b] - n[b];
    max_n = std::max(max_n, n[b]);
  }
  const at::Tensor out = AttendPadded(
      at::pad_sequence(qs, /*batch_first=*/true),
      at::pad_sequence(ks, /*batch_first=*/true),
      at::pad_sequence(vs, /*batch_first=*/true), offset, length, scale);
  bool dense = true;
  for (int64_t b = 0; b < batch; ++b) dense = dense && n[b] == max_n;
  if (dense) return out;
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n[b]; ++i) rows.push_back(b * max_n + i);
  }
  return out.index_select(0, at::tensor(rows, at::kLong).to(qs[0].device()));
}

at::Tensor PackedPaddedCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v,
                                       const std::vector<int64_t>& lengths,
                                       double scale) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  const int64_t max_n = *std::max_element(lengths.begin(), lengths.end());
  // Row r of sequence b (its i-th) goes to padded slot b * max_n + i.
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(q.size(0)));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < lengths[b]; ++i) slots.push_back(b * max_n + i);
  }
  const at::Tensor index = at::tensor(slots, at::kLong).to(q.device());
  // Zero padding, as pad_sequence pads.
  const auto pad = [&](const at::Tensor& x) {
    return at::zeros({batch * max_n, x.size(1), x.size(2)}, x.options())
        .index_copy(0, index, x)
        .view({batch, max_n, x.size(1), x.size(2)});
  };
  const at::Tensor out = AttendPadded(
      pad(q), pad(k), pad(v), std::vector<int64_t>(batch, 0), lengths, scale);
  if (static_cast<int64_t>(slots.size()) == batch * max_n) return out;
  return out.index_select(0, index);
}

}  // namespace tandem::model::internal
