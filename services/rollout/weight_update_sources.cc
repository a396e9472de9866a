#include "services/rollout/weight_update_sources.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"

namespace tandem::rollout {

absl::StatusOr<std::shared_ptr<model::ModelWeights>> MatchLiveWeights(
    const model::DecoderModel& model,
    std::shared_ptr<model::ModelWeights> received) {
  const std::shared_ptr<model::ModelWeights> live = model.weights();
  if (received->device() == live->device() &&
      received->config().dtype == live->config().dtype) {
    return received;
  }
  return received->To(live->device(), live->config().dtype);
}

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
      views.emplace(name, at::from_blob(
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

bool InplaceWeightSource::ParkedForTest() const {
  absl::MutexLock lock(&mu_);
  return parked_;
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
  parked_ = true;
  mu_.Await(absl::Condition(&done));
  parked_ = false;
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
