#pragma once

// The frozen reference policy of the trainer's KL penalty
// (training.kl_beta, training.reference_model).

#include <memory>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "services/trainer/trainer_config.h"

namespace tandem::trainer {

// Loads the reference policy that `config` asks for: nullptr when
// config.kl_beta is 0 (nothing is read), else the weights of
// config.reference_model, or of config.model_path when that is empty (the
// built-in model from config.model_seed when both are empty), in the
// checkpoint's dtype. `policy` is the trained policy's config: the
// vocabularies must match. Errors name the field and the file, e.g.
//   "training.reference_model: /m/ref/config.json: vocab_size 151936 differs
//    from the policy's 151665".
absl::StatusOr<std::shared_ptr<model::ModelWeights>> LoadReferencePolicy(
    const TrainerConfig& config, const model::ModelConfig& policy);

}  // namespace tandem::trainer
