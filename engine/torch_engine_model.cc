#include "engine/torch_engine_model.h"

#include "engine/torch_sampler.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model_weights.h"
#include "common/model/paged_kv_cache.h"
#include "engine/decode_graphs.h"

namespace tandem::engine {

TorchEngineModel::TorchEngineModel(
    std::shared_ptr<const model::DecoderModel> model, int64_t max_tokens,
    TorchEngineModelOptions options)
    : model_(std::move(model)), options_(options), max_tokens_(max_tokens) {}

TorchEngineModel::~TorchEngineModel() = default;

int32_t TorchEngineModel::vocab_size() const {
  return static_cast<int32_t>(model_->weights()->config().vocab_size);
}

absl::StatusOr<std::unique_ptr<model::KvCache>> TorchEngineModel::NewCache(
    const Sequence& seq) {
  const auto weights = model_->weights();
  if (!layout_resolved_) {
    const bool paged =
        options_.kv_layout == KvLayout::kPaged ||
        (options_.kv_layout == KvLayout::kAuto && options_.kv_blocks > 0);
    if (paged) {
      if (options_.kv_blocks <= 0 || options_.block_size <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "paged KV layout: kv_blocks and block_size must be > 0, got ",
            options_.kv_blocks, " and ", options_.block_size));
      }
      // CUDA graphs pad their batches into one scratch block of their own.
      const bool graphs = options_.cuda_graphs && weights->device().is_cuda();
      ASSIGN_OR_RETURN(pool_, model::KvBlockPool::Create(
                                  weights->config(), weights->dtype(),
                                  weights->device(),
                                  options_.kv_blocks + (graphs ? 1 : 0),
                                  options_.block_size,
                                  options_.paged_attention));
      if (graphs && pool_->Allocate(1, &scratch_)) {
        graphs_ = std::make_unique<DecodeGraphs>(
            model_.get(), pool_, int64_t{scratch_[0]} * options_.block_size);
      }
    }
    layout_resolved_ = true;
  }
  if (pool_ != nullptr) {
    ASSIGN_OR_RETURN(auto cache, model::PagedKvCache::Create(
                                     weights->config(), pool_, max_tokens_));
    return std::unique_ptr<model::KvCache>(std::move(cache));
  }
  ASSIGN_OR_RETURN(
      auto cache,
      model::ContiguousKvCache::Create(
          weights->config(), weights->dtype(), weights->device(), max_tokens_,
          seq.prompt.size() + seq.params.max_tokens));
  return std::unique_ptr<model::KvCache>(std::move(cache));
}

int64_t TorchEngineModel::graph_replays() const {
  return graphs_ == nullptr ? 0 : graphs_->replays();
}

int64_t TorchEngineModel::graph_captures() const {
  return graphs_ == nullptr ? 0 : graphs_->captures();
}

absl::Status TorchEngineModel::RunGraphStep(
    const std::vector<ForwardChunk>& chunks, at::Tensor* logits, bool* ran) {
  *ran = false;
  const int32_t vocab = vocab_size();
  std::vector<model::PagedKvCache*> caches;
  int64_t longest = 0;
  for (const ForwardChunk& c : chunks) {
    if (c.end - c.start != 1) return absl::OkStatus();
    auto it = caches_.find(c.seq->id);
    auto* cache = it == caches_.end()
                      ? nullptr
                      : dynamic_cast<model::PagedKvCache*>(it->second.get());
    const int32_t token = c.seq->token_at(c.start);
    if (cache == nullptr || cache->num_tokens() != c.start || token < 0 ||
        token >= vocab) {
      return absl::OkStatus();  // the eager path checks and reports
    }
    caches.push_back(cache);
    longest = std::max<int64_t>(longest, c.start + 1);
  }
  if (!DecodeGraphs::Fits(static_cast<int64_t>(chunks.size()), longest)) {
    return absl::OkStatus();
  }
  for (model::PagedKvCache* cache : caches) {
    // No side effects when it fails: the eager path then reports it.
    if (!cache->Reserve(1).ok()) return absl::OkStatus();
  }
  const size_t n = chunks.size();
  std::vector<int64_t> ids(n), positions(n), write;
  std::vector<std::vector<int64_t>> read(n);
  write.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const ForwardChunk& c = chunks[i];
    ids[i] = c.seq->token_at(c.start);
    positions[i] = c.start;
    caches[i]->AppendSlots(c.start, c.start + 1, &write);
    caches[i]->AppendSlots(0, c.start + 1, &read[i]);
  }
  ASSIGN_OR_RETURN(*logits, graphs_->Run(ids, positions, write, read));
  for (model::PagedKvCache* cache : caches) cache->Commit(1);
  *ran = true;
  return absl::OkStatus();
}

absl::Status TorchEngineModel::RunStep(const std::vector<ForwardChunk>& chunks,
                                       at::Tensor* logits) {
  if (graphs_ != nullptr) {
    at::Tensor all;
    bool ran = false;
    RETURN_IF_ERROR(RunGraphStep(chunks, &all, &ran));
    if (ran) return SelectWanted(chunks, all, logits);
  }
  std::vector<std::vector<int32_t>> tokens(chunks.size());
  std::vector<model::SequenceStep> steps(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ForwardChunk& c = chunks[i];
    auto& cache = caches_[c.seq->id];
    if (cache == nullptr) {
      auto created = NewCache(*c.seq);
      if (!created.ok()) {
        caches_.erase(c.seq->id);
        return created.status();
      }
      cache = std::move(created).value();
    }
    if (cache->num_tokens() != c.start) {
      return absl::InternalError(absl::StrCat(
          "sequence ", c.seq->id, ": cache holds ", cache->num_tokens(),
          " tokens, step starts at ", c.start));
    }
    tokens[i].reserve(c.end - c.start);
    for (int32_t t = c.start; t < c.end; ++t) {
      tokens[i].push_back(c.seq->token_at(t));
    }
    steps[i].tokens = tokens[i];
    steps[i].cache = cache.get();
  }
  ASSIGN_OR_RETURN(at::Tensor all, model_->ForwardWithCache(steps));
  return SelectWanted(chunks, all, logits);
}

absl::Status TorchEngineModel::SelectWanted(
    const std::vector<ForwardChunk>& chunks, at::Tensor all,
    at::Tensor* logits) {
  std::vector<int64_t> wanted;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].wants_logits) wanted.push_back(static_cast<int64_t>(i));
  }
  try {
    if (wanted.size() != chunks.size()) {
      all = all.index_select(
          0, at::tensor(wanted, at::TensorOptions().dtype(at::kLong))
                 .to(all.device()));
    }
    *logits = all.to(at::kFloat);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("selecting the sampled rows' logits: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> TorchEngineModel::Forward(
    const std::vector<ForwardChunk>& chunks) {
  at::Tensor logits;
  RETURN_IF_ERROR(RunStep(chunks, &logits));
  std::vector<float> out;
  if (logits.numel() == 0) return out;
  try {
    // Only the rows the sampler needs cross to the host.
    logits = logits.to(at::kCPU).contiguous();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("copying logits to the host: ", e.what()));
  }
  const float* data = logits.data_ptr<float>();
  out.assign(data, data + logits.numel());
  return out;
}

absl::StatusOr<std::vector<SampledToken>> TorchEngineModel::ForwardSample(
    const std::vector<ForwardChunk>& chunks,
    const std::vector<SampleRequest>& requests) {
  if (options_.sampling == SampleWhere::kHost) {
    return EngineModel::ForwardSample(chunks, requests);
  }
  at::Tensor logits;
  RETURN_IF_ERROR(RunStep(chunks, &logits));
  return SampleRows(logits, requests);
}

absl::StatusOr<std::vector<SampledToken>> SampleRows(
    const at::Tensor& logits, const std::vector<SampleRequest>& requests) {
  const int64_t rows = static_cast<int64_t>(requests.size());
  std::vector<SampledToken> out(requests.size());
  if (rows == 0) return out;
  if (logits.dim() != 2 || logits.size(0) != rows) {
    return absl::InternalError(
        absl::StrCat("sampling ", rows, " rows from logits of shape ",
                     c10::str(logits.sizes())));
  }
  try {
    c10::InferenceMode inference_mode;
    const at::Device device = logits.device();
    const int64_t vocab = logits.size(1);
    std::vector<float> inv_t(rows);
    std::vector<double> uniform(rows);
    // Greedy rows need only the argmax and log_z; `full` rows draw from the
    // whole vocabulary by inverse CDF; `truncated` ones from their top-k /
    // top-p candidates.
    std::vector<int64_t> full, truncated;
    bool all_unit = true;
    for (int64_t r = 0; r < rows; ++r) {
      const SamplingParams& p = *requests[r].params;
      const bool greedy = p.temperature <= 0.0f;
      inv_t[r] = greedy ? 1.0f : 1.0f / p.temperature;
      all_unit = all_unit && inv_t[r] == 1.0f;
      uniform[r] = requests[r].uniform;
      if (greedy) continue;
      if ((p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f) {
        truncated.push_back(r);
      } else {
        full.push_back(r);
      }
    }
    const auto to_device = [&](auto& v, at::ScalarType type) {
      return at::tensor(v, at::TensorOptions().dtype(type)).to(device);
    };
    // Scaling by 1 is exact, so an all-greedy (or T = 1) step skips it.
    const at::Tensor scaled =
        all_unit
            ? logits.to(at::kFloat)
            : logits.to(at::kFloat) * to_device(inv_t, at::kFloat).unsqueeze(1);
    const at::Tensor log_z = at::logsumexp(scaled, 1);
    at::Tensor token = scaled.argmax(1);
    if (!full.empty()) {
      // Inverse CDF over the whole vocabulary (in double, as the host
      // does), for those rows only.
      const bool every_row = static_cast<int64_t>(full.size()) == rows;
      const at::Tensor index = to_device(full, at::kLong);
      const at::Tensor rows_scaled =
          every_row ? scaled : scaled.index_select(0, index);
      const at::Tensor rows_log_z =
          every_row ? log_z : log_z.index_select(0, index);
      std::vector<double> u_full;
      u_full.reserve(full.size());
      for (int64_t r : full) u_full.push_back(uniform[r]);
      const at::Tensor cdf = (rows_scaled - rows_log_z.unsqueeze(1))
                                 .exp()
                                 .to(at::kDouble)
                                 .cumsum(1);
      const at::Tensor target =
          (to_device(u_full, at::kDouble) * cdf.select(1, vocab - 1))
              .unsqueeze(1);
      const at::Tensor drawn =
          at::searchsorted(cdf, target).squeeze(1).clamp_max(vocab - 1);
      token = every_row ? drawn : token.index_copy(0, index, drawn);
    }
    // Top-k / top-p rows (rare in RL): candidates sorted by logit (ties by
    // id), cut, then the same inverse CDF.
    for (int64_t r : truncated) {
      const SamplingParams& p = *requests[r].params;
      const auto [values, order] =
          scaled[r].sort(/*stable=*/true, /*dim=*/0, /*descending=*/true);
      const int64_t k =
          p.top_k > 0 ? std::min<int64_t>(p.top_k, vocab) : vocab;
      at::Tensor probs =
          (values.narrow(0, 0, k) - log_z[r]).exp().to(at::kDouble);
      int64_t keep = k;
      if (p.top_p < 1.0f) {
        const at::Tensor below = probs.cumsum(0) < static_cast<double>(p.top_p);
        keep = std::min<int64_t>(k, below.sum().item<int64_t>() + 1);
      }
      const at::Tensor c = probs.narrow(0, 0, keep).cumsum(0);
      const at::Tensor pick =
          at::searchsorted(c, (c[keep - 1] * uniform[r]).reshape({1}))
              .clamp_max(keep - 1);
      token[r] = order.index_select(0, pick).squeeze(0);
    }
    const at::Tensor logprob =
        scaled.gather(1, token.unsqueeze(1)).squeeze(1) - log_z;
    // The only copy to the host: ids and log-probs.
    const at::Tensor host =
        at::stack({token.to(at::kDouble), logprob.to(at::kDouble)})
            .to(at::kCPU)
            .contiguous();
    const double* data = host.data_ptr<double>();
    for (int64_t r = 0; r < rows; ++r) {
      out[r].token = static_cast<int32_t>(data[r]);
      out[r].logprob = static_cast<float>(data[rows + r]);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("sampling on the device: ", e.what()));
  }
  return out;
}

bool TorchEngineModel::ForkCache(uint64_t src, uint64_t dst,
                                 int32_t num_tokens) {
  auto it = caches_.find(src);
  if (it == caches_.end() || it->second->num_tokens() < num_tokens) {
    return false;
  }
  if (auto* paged = dynamic_cast<model::PagedKvCache*>(it->second.get())) {
    auto fork = paged->Fork(num_tokens);
    if (!fork.ok()) return false;
    caches_[dst] = std::move(fork).value();
    return true;
  }
  auto* contiguous = dynamic_cast<model::ContiguousKvCache*>(it->second.get());
  if (contiguous == nullptr) return false;
  auto fork = contiguous->Fork();
  if (!fork.ok()) return false;
  (*fork)->Truncate(num_tokens);
  caches_[dst] = std::move(fork).value();
  return true;
}

void TorchEngineModel::ReleaseCache(uint64_t seq_id) { caches_.erase(seq_id); }

}  // namespace tandem::engine
