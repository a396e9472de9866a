#include "services/trainer/reference_policy.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_loader.h"

namespace tandem::trainer {

absl::StatusOr<std::shared_ptr<model::ModelWeights>> LoadReferencePolicy(
    const TrainerConfig& config, const model::ModelConfig& policy) {
  if (config.kl_beta == 0.0) return nullptr;
  const bool defaulted = config.reference_model.empty();
  const std::string field = defaulted ? "training.reference_model (default: "
                                        "model.path)"
                                      : "training.reference_model";
  const std::string& path =
      defaulted ? config.model_path : config.reference_model;
  auto error = [&field](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrCat(field, ": ", status.message()));
  };
  std::shared_ptr<model::ModelWeights> weights;
  if (path.empty()) {
    // The built-in model: the same random weights the policy started from.
    absl::StatusOr<model::LoadedModel> builtin =
        model::LoadModel("", static_cast<uint64_t>(config.model_seed), 0);
    if (!builtin.ok()) return error(builtin.status());
    weights = builtin->decoder->weights();
    if (weights->config().vocab_size != policy.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": the built-in model's vocab_size ",
                       weights->config().vocab_size,
                       " differs from the policy's ", policy.vocab_size));
    }
  } else {
    // The vocabulary first: config.json is cheap, the weights are not.
    absl::StatusOr<model::ModelConfig> reference = model::ReadModelConfig(path);
    if (!reference.ok()) return error(reference.status());
    if (reference->vocab_size != policy.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", path, "/config.json: vocab_size ", reference->vocab_size,
          " differs from the policy's ", policy.vocab_size));
    }
    absl::StatusOr<std::shared_ptr<model::ModelWeights>> loaded =
        model::LoadHfModel(path);
    if (!loaded.ok()) return error(loaded.status());
    weights = *std::move(loaded);
  }
  return weights;
}

}  // namespace tandem::trainer
