#include "services/rollout/torch_engine_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/task/arith_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/weights/model_flattening.h"

namespace tandem::rollout {

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, uint64_t seed,
                                      int32_t torch_threads) {
  if (torch_threads > 0) torch::set_num_threads(torch_threads);
  LoadedModel loaded;
  std::shared_ptr<model::ModelWeights> weights;
  if (path.empty()) {
    ASSIGN_OR_RETURN(auto tokenizer, task::LoadArithTokenizer());
    loaded.tokenizer = std::move(tokenizer);
    model::ModelConfig config =
        model::BuiltinTinyModelConfig(loaded.tokenizer->vocab_size());
    if (auto eos = loaded.tokenizer->TokenId("<|eos|>")) {
      config.eos_token_ids = {*eos};
    }
    ASSIGN_OR_RETURN(weights, model::RandomInit(config, seed));
    loaded.description =
        absl::StrCat("built-in tiny model (random init, seed ", seed, ")");
  } else {
    ASSIGN_OR_RETURN(weights, model::LoadHfModel(path));
    ASSIGN_OR_RETURN(auto tokenizer,
                     tokenizer::Tokenizer::FromFile(path + "/tokenizer.json"));
    loaded.tokenizer = std::move(tokenizer);
    loaded.description = path;
  }
  for (int64_t id : weights->config().eos_token_ids) {
    loaded.eos_token_ids.push_back(static_cast<int32_t>(id));
  }
  loaded.max_tokens = weights->config().max_position_embeddings;
  loaded.decoder = std::make_shared<model::DecoderModel>(std::move(weights));
  return loaded;
}

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
  logits = logits.to(at::kFloat).contiguous();
  const int64_t vocab = logits.size(1);
  std::vector<float> out;
  const float* data = logits.data_ptr<float>();
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!chunks[i].wants_logits) continue;
    out.insert(out.end(), data + i * vocab, data + (i + 1) * vocab);
  }
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

StagedWeightSource::StagedWeightSource(
    std::shared_ptr<model::DecoderModel> model)
    : model_(std::move(model)) {}

StagedWeightSource::~StagedWeightSource() = default;

void StagedWeightSource::Stage(uint64_t version,
                               std::shared_ptr<model::ModelWeights> weights) {
  absl::MutexLock lock(&mu_);
  if (version <= staged_version_) return;
  staged_version_ = version;
  staged_ = std::move(weights);
}

uint64_t StagedWeightSource::ReadyVersion(uint64_t live) {
  absl::MutexLock lock(&mu_);
  return staged_ != nullptr && staged_version_ > live ? staged_version_ : 0;
}

absl::StatusOr<uint64_t> StagedWeightSource::Commit(uint64_t version) {
  std::shared_ptr<model::ModelWeights> staged;
  {
    absl::MutexLock lock(&mu_);
    if (version != staged_version_ || staged_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("version ", version, " is not the staged one (",
                       staged_version_, ")"));
    }
    staged = std::move(staged_);
  }
  // The old live weights are released here or when the caller drops them;
  // a transport that double-buffers keeps them for the next version.
  RETURN_IF_ERROR(model_->SwapWeights(std::move(staged)).status());
  return version;
}

absl::StatusOr<std::unique_ptr<InplaceWeightSource>>
InplaceWeightSource::Create(std::shared_ptr<model::DecoderModel> model,
                            uint64_t live_version,
                            const weights::LayoutOptions& layout_options) {
  const std::shared_ptr<model::ModelWeights> current = model->weights();
  if (current->device() != at::kCPU) {
    return absl::UnimplementedError(absl::StrCat(
        "engine.update_mode inplace: weights on ", current->device().str(),
        "; the in-place buffer is host memory (CPU only)"));
  }
  ASSIGN_OR_RETURN(weights::FlatWeightLayout layout,
                   weights::LayoutForModel(*current, layout_options));
  ASSIGN_OR_RETURN(std::unique_ptr<weights::StagingWeights> created,
                   weights::StagingWeights::Create(
                       std::move(layout), weights::StagingMode::kInplace));
  std::shared_ptr<weights::StagingWeights> staging = std::move(created);
  const absl::Span<uint8_t> buffer = staging->inplace_buffer();
  std::map<std::string, at::Tensor> views;
  try {
    for (const weights::TensorPlacement& placement :
         staging->layout().tensors()) {
      const std::string& name = placement.info.name;
      const at::Tensor& tensor = current->tensors().at(name);
      uint8_t* data = buffer.data() + placement.offset;
      const at::Tensor cpu = tensor.detach().contiguous();
      std::memcpy(data, cpu.data_ptr(), placement.info.byte_size);
      // Every view owns a reference to the buffer: the weights stay valid
      // for as long as any tensor of the model exists.
      views.emplace(name, torch::from_blob(
                              data, tensor.sizes(), [staging](void*) {},
                              at::TensorOptions(tensor.scalar_type())));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("engine.update_mode inplace: cannot view the weights in "
                     "the flat buffer: ",
                     e.what()));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<model::ModelWeights> viewed,
      model::ModelWeights::Create(current->config(), std::move(views),
                                  "in-place weight buffer"));
  RETURN_IF_ERROR(model->SwapWeights(std::move(viewed)).status());
  std::unique_ptr<InplaceWeightSource> source(
      new InplaceWeightSource(std::move(model), staging, live_version));
  staging->SetInplaceGate(source.get());
  return source;
}

InplaceWeightSource::InplaceWeightSource(
    std::shared_ptr<model::DecoderModel> model,
    std::shared_ptr<weights::StagingWeights> staging, uint64_t live_version)
    : model_(std::move(model)),
      staging_(std::move(staging)),
      live_version_(live_version) {}

InplaceWeightSource::~InplaceWeightSource() {
  Shutdown();
  staging_->SetInplaceGate(nullptr);
}

void InplaceWeightSource::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

InplaceWeightSource::Stats InplaceWeightSource::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

uint64_t InplaceWeightSource::ReadyVersion(uint64_t live) {
  absl::MutexLock lock(&mu_);
  if (writing_ || !valid_) {
    // Park: Commit() waits for the writer. Non-zero whatever the version.
    return std::max(writing_version_, live + 1);
  }
  if (live_version_ > live) return live_version_;  // written between steps
  engine_in_step_ = true;
  return 0;
}

absl::StatusOr<uint64_t> InplaceWeightSource::Commit(uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || (!writing_ && valid_);
  };
  mu_.Await(absl::Condition(&done));
  if (!writing_ && valid_) {
    engine_in_step_ = true;
    return live_version_;
  }
  return absl::CancelledError(absl::StrCat(
      "shutting down while the engine was parked for the in-place update to "
      "v",
      std::max(version, writing_version_)));
}

void InplaceWeightSource::StepDone() {
  absl::MutexLock lock(&mu_);
  engine_in_step_ = false;
}

absl::Status InplaceWeightSource::BeginWrite(uint64_t version) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  writing_version_ = version;
  ++stats_.writes;
  if (!writing_) {
    // From here the engine starts no step; wait for the one under way.
    writing_ = true;
    auto parked = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !engine_in_step_ || shutdown_;
    };
    mu_.Await(absl::Condition(&parked));
    if (engine_in_step_) {
      writing_ = false;
      return absl::CancelledError(
          "shutting down: the engine did not park for the in-place update");
    }
  }
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  stats_.max_park_wait_seconds = std::max(stats_.max_park_wait_seconds, waited);
  stats_.total_park_wait_seconds += waited;
  valid_ = false;
  return absl::OkStatus();
}

void InplaceWeightSource::EndWrite(std::optional<uint64_t> live) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (live.has_value()) {
    valid_ = true;
    live_version_ = *live;
  } else {
    valid_ = false;
    ++stats_.invalidations;
  }
}

}  // namespace tandem::rollout
