#include "engine/torch_engine_model.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model_weights.h"

namespace tandem::engine {

TorchEngineModel::TorchEngineModel(std::shared_ptr<model::DecoderModel> model,
                                   int64_t max_tokens)
    : model_(std::move(model)), max_tokens_(max_tokens) {}

TorchEngineModel::~TorchEngineModel() = default;

int32_t TorchEngineModel::vocab_size() const {
  return static_cast<int32_t>(model_->weights()->config().vocab_size);
}

absl::StatusOr<std::vector<float>> TorchEngineModel::Forward(
    const std::vector<ForwardChunk>& chunks) {
  std::vector<std::vector<int32_t>> tokens(chunks.size());
  std::vector<model::SequenceStep> steps(chunks.size());
  const auto weights = model_->weights();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ForwardChunk& c = chunks[i];
    auto& cache = caches_[c.seq->id];
    if (cache == nullptr) {
      ASSIGN_OR_RETURN(
          cache,
          model::ContiguousKvCache::Create(
              weights->config(), weights->dtype(), weights->device(),
              max_tokens_, c.seq->prompt.size() + c.seq->params.max_tokens));
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
  ASSIGN_OR_RETURN(at::Tensor logits, model_->ForwardWithCache(steps));
  std::vector<int64_t> wanted;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].wants_logits) wanted.push_back(static_cast<int64_t>(i));
  }
  std::vector<float> out;
  if (wanted.empty()) return out;
  try {
    // Only the rows the sampler needs cross to the host (one copy from a
    // GPU).
    if (wanted.size() != chunks.size()) {
      logits = logits.index_select(
          0, at::tensor(wanted, at::TensorOptions().dtype(at::kLong))
                 .to(logits.device()));
    }
    logits = logits.to(at::kCPU, at::kFloat).contiguous();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("copying logits to the host: ", e.what()));
  }
  const float* data = logits.data_ptr<float>();
  out.assign(data, data + logits.numel());
  return out;
}

bool TorchEngineModel::ForkCache(uint64_t src, uint64_t dst,
                                 int32_t num_tokens) {
  auto it = caches_.find(src);
  if (it == caches_.end() || it->second->num_tokens() < num_tokens) {
    return false;
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
