#include "common/model/decoder_model.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/layers.h"
#include "common/model/paged_kv_cache.h"
#include "common/model/torch_status.h"

namespace tandem::model {
namespace {

using internal::ApplyRope;
using internal::CausalAttention;
using internal::Linear;
using internal::RmsNorm;

// Runs embedding, all layers and the final norm over the packed tokens
// `input_ids` [T] at `positions` [T]. `attend(layer, q, k, v, scale)` gets
// the post-RoPE q [T, heads, head_dim] and k, v [T, kv_heads, head_dim] and
// returns attention outputs [T, heads * head_dim]. `form` is internal::
// Linear's for every projection. May throw c10::Error.
template <typename Attend>
at::Tensor RunDecoder(const ModelWeights& w, const at::Tensor& inv_freq,
                      const at::Tensor& input_ids, const at::Tensor& positions,
                      internal::LinearForm form, Attend&& attend) {
  const ModelConfig& c = w.config();
  const int64_t t = input_ids.size(0);
  const double eps = c.rms_norm_eps;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const auto [cos, sin] = internal::RopeCosSin(inv_freq, positions, w.dtype());
  at::Tensor x = at::embedding(w.embed_tokens(), input_ids);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = w.layer(i);
    at::Tensor h = RmsNorm(x, l.input_layernorm, eps);
    at::Tensor q = Linear(h, l.q_proj, l.q_bias, form)
                       .view({t, c.num_attention_heads, c.head_dim});
    at::Tensor k = Linear(h, l.k_proj, l.k_bias, form)
                       .view({t, c.num_key_value_heads, c.head_dim});
    at::Tensor v = Linear(h, l.v_proj, l.v_bias, form)
                       .view({t, c.num_key_value_heads, c.head_dim});
    if (c.qk_norm) {
      q = RmsNorm(q, l.q_norm, eps);
      k = RmsNorm(k, l.k_norm, eps);
    }
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, cos, sin);
    const at::Tensor attn = attend(i, q, k, v, scale);
    x = x + Linear(attn, l.o_proj, l.o_bias, form);
    h = RmsNorm(x, l.post_attention_layernorm, eps);
    const at::Tensor none;
    x = x + Linear(at::silu(Linear(h, l.gate_proj, none, form)) *
                       Linear(h, l.up_proj, none, form),
                   l.down_proj, none, form);
  }
  return RmsNorm(x, w.final_norm(), eps);
}

absl::Status CheckTokenRange(int64_t min_id, int64_t max_id, int64_t vocab,
                             absl::string_view what) {
  if (min_id < 0 || max_id >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": token ids must be in [0, ", vocab,
                     "), got range [", min_id, ", ", max_id, "]"));
  }
  return absl::OkStatus();
}

bool SameRope(const ModelConfig& a, const ModelConfig& b) {
  if (a.rope_theta != b.rope_theta ||
      a.rope_scaling.has_value() != b.rope_scaling.has_value()) {
    return false;
  }
  if (!a.rope_scaling.has_value()) return true;
  const RopeScaling& x = *a.rope_scaling;
  const RopeScaling& y = *b.rope_scaling;
  return x.factor == y.factor && x.low_freq_factor == y.low_freq_factor &&
         x.high_freq_factor == y.high_freq_factor &&
         x.original_max_position_embeddings ==
             y.original_max_position_embeddings;
}

bool SameShapes(const ModelConfig& a, const ModelConfig& b) {
  const std::vector<ExpectedTensor> ea = ExpectedTensors(a);
  const std::vector<ExpectedTensor> eb = ExpectedTensors(b);
  if (ea.size() != eb.size()) return false;
  for (size_t i = 0; i < ea.size(); ++i) {
    if (ea[i].name != eb[i].name || ea[i].shape != eb[i].shape) return false;
  }
  return true;
}

}  // namespace

DecoderModel::DecoderModel(std::shared_ptr<ModelWeights> weights,
                           DecoderOptions options)
    : options_(options),
      inv_freq_(internal::RopeInverseFrequencies(weights->config())),
      weights_(std::move(weights)) {}

internal::LinearForm DecoderModel::FormFor(const ModelWeights& weights,
                                           int64_t rows) const {
  using internal::LinearForm;
  LinearForm form = LinearForm::kLinear;
  switch (options_.linear) {
    case LinearMode::kLinear:
      break;
    case LinearMode::kWeightLeft:
      form = LinearForm::kWeightLeft;
      break;
    case LinearMode::kRowKernel:
      form = LinearForm::kRowKernel;
      break;
    case LinearMode::kAuto:
      if (weights.device().is_cpu() && weights.dtype() == at::kFloat) {
        form = internal::AutoLinearForm(rows);
      }
      break;
  }
  return form;
}

bool DecoderModel::UsePaddedAttention(const ModelConfig& c,
                                      int64_t element_size,
                                      const std::vector<int64_t>& n,
                                      const std::vector<int64_t>& length,
                                      bool paged) const {
  const int64_t batch = static_cast<int64_t>(n.size());
  if (batch < 2 || options_.attention == AttentionMode::kPerSequence) {
    return false;
  }
  if (options_.attention == AttentionMode::kPadded) return true;
  // Rough single-core CPU costs (LibTorch 1.13, AVX-512): fixed op
  // overheads, matmul throughput and copy bandwidth.
  constexpr double kPerSequenceOpsSeconds = 50e-6;
  constexpr double kPaddedFixedSeconds = 200e-6;
  constexpr double kPaddedPerSequenceSeconds = 15e-6;
  constexpr double kFlopsPerSecond = 30e9;
  constexpr double kCopyBytesPerSecond = 4e9;
  double real = 0;
  int64_t max_n = 0, max_length = 0;
  for (int64_t b = 0; b < batch; ++b) {
    real += static_cast<double>(n[b]) * static_cast<double>(length[b]);
    max_n = std::max(max_n, n[b]);
    max_length = std::max(max_length, length[b]);
  }
  const double padded = static_cast<double>(batch * max_n * max_length);
  const double flops_per_score = 4.0 * c.num_attention_heads * c.head_dim;
  const double copied_bytes = static_cast<double>(batch) * element_size *
                              c.head_dim *
                              (2.0 * max_length * c.num_key_value_heads +
                               max_n * c.num_attention_heads);
  const double per_sequence_cost =
      batch * kPerSequenceOpsSeconds + real * flops_per_score / kFlopsPerSecond;
  // Paged caches are gathered (copied) by either strategy, so only a
  // contiguous cache saves the copy by attending per sequence.
  const double padded_cost =
      kPaddedFixedSeconds + batch * kPaddedPerSequenceSeconds +
      padded * flops_per_score / kFlopsPerSecond +
      (paged ? 0.0 : 2.0 * copied_bytes / kCopyBytesPerSecond);
  return padded_cost < per_sequence_cost;
}

absl::StatusOr<std::shared_ptr<ModelWeights>> DecoderModel::SwapWeights(
    std::shared_ptr<ModelWeights> next) {
  if (next == nullptr) {
    return absl::InvalidArgumentError("SwapWeights: null weights");
  }
  const std::shared_ptr<ModelWeights> live = weights_.load();
  if (!SameShapes(live->config(), next->config()) ||
      !SameRope(live->config(), next->config()) ||
      live->dtype() != next->dtype() || live->device() != next->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SwapWeights: new weights (",
                     ArchitectureName(next->config().architecture), ", ",
                     c10::toString(next->dtype()), ", ", next->device().str(),
                     ") do not match the live ones (",
                     ArchitectureName(live->config().architecture), ", ",
                     c10::toString(live->dtype()), ", ", live->device().str(),
                     ") in names, shapes, RoPE parameters, dtype or device"));
  }
  return weights_.exchange(std::move(next));
}

absl::StatusOr<at::Tensor> DecoderModel::ForwardPackedHidden(
    const at::Tensor& input_ids, const at::Tensor& position_ids,
    const at::Tensor& cu_seqlens) const {
  return PackedHidden(*weights_.load(), input_ids, position_ids, cu_seqlens);
}

absl::StatusOr<at::Tensor> DecoderModel::PackedHidden(
    const ModelWeights& weights, const at::Tensor& input_ids,
    const at::Tensor& position_ids, const at::Tensor& cu_seqlens) const {
  const ModelWeights* w = &weights;
  const ModelConfig& c = w->config();
  constexpr absl::string_view kWhat = "ForwardPackedHidden";
  if (!input_ids.defined() || !position_ids.defined() ||
      !cu_seqlens.defined() || input_ids.dim() != 1 ||
      position_ids.sizes() != input_ids.sizes() || cu_seqlens.dim() != 1 ||
      cu_seqlens.size(0) < 2 || input_ids.size(0) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhat,
        ": need input_ids [T] (T > 0), position_ids [T] and cu_seqlens "
        "[B+1] (B > 0)"));
  }
  for (const at::Tensor* t : {&input_ids, &position_ids, &cu_seqlens}) {
    if (t->scalar_type() != at::kLong && t->scalar_type() != at::kInt) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": index tensors must be int64 or int32, got ",
                       c10::toString(t->scalar_type())));
    }
  }
  try {
    const int64_t t = input_ids.size(0);
    const at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
    const int64_t* bounds = cu.data_ptr<int64_t>();
    const int64_t num_seqs = cu.size(0) - 1;
    if (bounds[0] != 0 || bounds[num_seqs] != t) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": cu_seqlens must start at 0 and end at T = ", t,
                       ", got ", bounds[0], " ... ", bounds[num_seqs]));
    }
    for (int64_t b = 0; b < num_seqs; ++b) {
      if (bounds[b + 1] <= bounds[b]) {
        return absl::InvalidArgumentError(absl::StrCat(
            kWhat, ": cu_seqlens must be strictly increasing, got ", bounds[b],
            " then ", bounds[b + 1], " at index ", b));
      }
    }
    const at::Tensor ids = input_ids.to(w->device(), at::kLong);
    RETURN_IF_ERROR(CheckTokenRange(ids.min().item<int64_t>(),
                                    ids.max().item<int64_t>(), c.vocab_size,
                                    kWhat));
    const at::Tensor positions = position_ids.to(w->device(), at::kLong);
    if (positions.min().item<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": position_ids must be >= 0"));
    }
    std::vector<int64_t> lengths(num_seqs);
    for (int64_t b = 0; b < num_seqs; ++b) {
      lengths[b] = bounds[b + 1] - bounds[b];
    }
    const bool padded = UsePaddedAttention(c, c10::elementSize(w->dtype()),
                                           lengths, lengths, /*paged=*/false);
    auto attend = [&](int64_t, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, double scale) {
      if (num_seqs == 1) {
        return CausalAttention(q, k.transpose(0, 1), v.transpose(0, 1), scale);
      }
      if (padded) {
        return internal::PackedPaddedCausalAttention(q, k, v, lengths, scale);
      }
      // One split per tensor, not a narrow per sequence: the backward of
      // a split is one concatenation, that of B narrows B zero-padded
      // gradients of the whole tensor, summed.
      const std::vector<at::Tensor> qs = q.split_with_sizes(lengths, 0);
      const std::vector<at::Tensor> ks = k.split_with_sizes(lengths, 0);
      const std::vector<at::Tensor> vs = v.split_with_sizes(lengths, 0);
      std::vector<at::Tensor> outs;
      outs.reserve(num_seqs);
      for (int64_t b = 0; b < num_seqs; ++b) {
        outs.push_back(CausalAttention(qs[b], ks[b].transpose(0, 1),
                                       vs[b].transpose(0, 1), scale));
      }
      return at::cat(outs, 0);
    };
    return RunDecoder(*w, inv_freq_, ids, positions, FormFor(*w, t), attend);
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(kWhat, e);
  }
}

absl::StatusOr<at::Tensor> DecoderModel::ForwardPacked(
    const at::Tensor& input_ids, const at::Tensor& position_ids,
    const at::Tensor& cu_seqlens) const {
  // One load, so that a concurrent SwapWeights cannot mix two versions.
  const std::shared_ptr<ModelWeights> w = weights_.load();
  ASSIGN_OR_RETURN(at::Tensor hidden,
                   PackedHidden(*w, input_ids, position_ids, cu_seqlens));
  try {
    return Linear(hidden, w->lm_head(), at::Tensor(),
                  FormFor(*w, hidden.size(0)));
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus("ForwardPacked: lm_head", e);
  }
}

absl::StatusOr<at::Tensor> DecoderModel::LmHead(
    const at::Tensor& hidden) const {
  const std::shared_ptr<ModelWeights> w = weights_.load();
  try {
    if (hidden.dim() == 2) {
      return Linear(hidden, w->lm_head(), at::Tensor(),
                    FormFor(*w, hidden.size(0)));
    }
    return at::linear(hidden, w->lm_head());
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus("LmHead", e);
  }
}

absl::StatusOr<at::Tensor> DecoderModel::ForwardWithCache(
    absl::Span<const SequenceStep> steps, bool all_logits) const {
  constexpr absl::string_view kWhat = "ForwardWithCache";
  const std::shared_ptr<ModelWeights> w = weights_.load();
  const ModelConfig& c = w->config();
  if (steps.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": no sequences"));
  }
  const int64_t num_seqs = static_cast<int64_t>(steps.size());
  std::vector<int64_t> starts(num_seqs + 1, 0);  // offsets into the packing
  std::vector<int64_t> cached(num_seqs, 0);      // tokens already cached
  std::set<const KvCache*> seen;
  int32_t min_id = std::numeric_limits<int32_t>::max();
  int32_t max_id = std::numeric_limits<int32_t>::min();
  for (int64_t b = 0; b < num_seqs; ++b) {
    const SequenceStep& step = steps[b];
    if (step.cache == nullptr || step.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": sequence ", b, " has no cache or no tokens"));
    }
    if (!seen.insert(step.cache).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": sequence ", b, " repeats a cache"));
    }
    for (int32_t id : step.tokens) {
      min_id = std::min(min_id, id);
      max_id = std::max(max_id, id);
    }
    cached[b] = step.cache->num_tokens();
    starts[b + 1] = starts[b] + static_cast<int64_t>(step.tokens.size());
  }
  RETURN_IF_ERROR(CheckTokenRange(min_id, max_id, c.vocab_size, kWhat));
  for (int64_t b = 0; b < num_seqs; ++b) {
    absl::Status reserved =
        steps[b].cache->Reserve(static_cast<int64_t>(steps[b].tokens.size()));
    if (!reserved.ok()) {
      return absl::Status(
          reserved.code(),
          absl::StrCat(kWhat, ": sequence ", b, ": ", reserved.message()));
    }
  }
  const int64_t total = starts[num_seqs];
  try {
    c10::InferenceMode inference_mode;
    // On a GPU the host side is pinned and the copies asynchronous (the
    // caching host allocator keeps the buffers until the copies are done).
    const bool to_gpu = w->device().is_cuda();
    const auto host_options =
        at::TensorOptions().dtype(at::kLong).pinned_memory(to_gpu);
    at::Tensor ids = at::empty({total}, host_options);
    at::Tensor positions = at::empty({total}, host_options);
    int64_t* id_data = ids.data_ptr<int64_t>();
    int64_t* pos_data = positions.data_ptr<int64_t>();
    for (int64_t b = 0; b < num_seqs; ++b) {
      for (size_t j = 0; j < steps[b].tokens.size(); ++j) {
        id_data[starts[b] + j] = steps[b].tokens[j];
        pos_data[starts[b] + j] = cached[b] + static_cast<int64_t>(j);
      }
    }
    ids = ids.to(w->device(), /*non_blocking=*/to_gpu);
    positions = positions.to(w->device(), /*non_blocking=*/to_gpu);
    std::vector<int64_t> n(num_seqs), lengths(num_seqs);
    for (int64_t b = 0; b < num_seqs; ++b) {
      n[b] = starts[b + 1] - starts[b];
      lengths[b] = cached[b] + n[b];
    }
    std::vector<KvCache*> caches(num_seqs);
    for (int64_t b = 0; b < num_seqs; ++b) caches[b] = steps[b].cache;
    const bool paged = PagedBatch::SharesOnePool(caches);
    const bool padded = UsePaddedAttention(c, c10::elementSize(w->dtype()), n,
                                           lengths, paged);
    // Paged caches of one pool: the whole batch's keys and values are
    // stored and gathered with one op per tensor and layer (PagedBatch),
    // or on a decode-only step read in place by the decode kernel.
    std::unique_ptr<PagedBatch> batch;
    if (paged && (padded || PagedBatch::UsesKernel(caches, n))) {
      batch = PagedBatch::Plan(caches, n);
    }
    auto attend = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, double scale) {
      if (batch != nullptr) return batch->Attend(layer, q, k, v, scale);
      std::vector<at::Tensor> outs, qs, ks, vs;
      for (int64_t b = 0; b < num_seqs; ++b) {
        KvCache* cache = steps[b].cache;
        cache->Store(layer, k.narrow(0, starts[b], n[b]),
                     v.narrow(0, starts[b], n[b]));
        auto [keys, values] = cache->Read(layer, lengths[b]);
        const at::Tensor q_b = q.narrow(0, starts[b], n[b]);
        if (padded) {
          qs.push_back(q_b);
          ks.push_back(keys.transpose(0, 1));
          vs.push_back(values.transpose(0, 1));
        } else {
          outs.push_back(CausalAttention(q_b, keys, values, scale));
        }
      }
      if (padded) return internal::PaddedCausalAttention(qs, ks, vs, scale);
      return num_seqs == 1 ? outs[0] : at::cat(outs, 0);
    };
    at::Tensor hidden =
        RunDecoder(*w, inv_freq_, ids, positions, FormFor(*w, total), attend);
    if (!all_logits) {
      std::vector<int64_t> last(num_seqs);
      for (int64_t b = 0; b < num_seqs; ++b) last[b] = starts[b + 1] - 1;
      hidden = hidden.index_select(
          0, at::tensor(last, at::TensorOptions().dtype(at::kLong))
                 .to(w->device()));
    }
    at::Tensor logits =
        Linear(hidden, w->lm_head(), at::Tensor(), FormFor(*w, hidden.size(0)))
            .to(at::kFloat);
    for (int64_t b = 0; b < num_seqs; ++b) {
      steps[b].cache->Commit(static_cast<int64_t>(steps[b].tokens.size()));
    }
    return logits;
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(kWhat, e);
  }
}

at::Tensor DecoderModel::DecodeOnDevice(const ModelWeights& w,
                                        const at::Tensor& inv_freq,
                                        const at::Tensor& ids,
                                        const at::Tensor& positions,
                                        const PagedBatch& batch) const {
  c10::InferenceMode inference_mode;
  const internal::LinearForm form = FormFor(w, ids.size(0));
  auto attend = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, double scale) {
    return batch.Attend(layer, q, k, v, scale);
  };
  const at::Tensor hidden =
      RunDecoder(w, inv_freq, ids, positions, form, attend);
  return Linear(hidden, w.lm_head(), at::Tensor(), form).to(at::kFloat);
}

absl::StatusOr<at::Tensor> DecoderModel::Prefill(
    absl::Span<const int32_t> tokens, KvCache* cache) const {
  const SequenceStep step{tokens, cache};
  ASSIGN_OR_RETURN(at::Tensor logits, ForwardWithCache({&step, 1}));
  return logits[0];
}

absl::StatusOr<at::Tensor> DecoderModel::DecodeStep(
    absl::Span<const int32_t> tokens, absl::Span<KvCache* const> caches) const {
  if (tokens.size() != caches.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeStep: ", tokens.size(), " tokens for ",
                     caches.size(), " caches"));
  }
  std::vector<SequenceStep> steps(tokens.size());
  for (size_t b = 0; b < tokens.size(); ++b) {
    steps[b] = {tokens.subspan(b, 1), caches[b]};
  }
  return ForwardWithCache(steps);
}

}  // namespace tandem::model
