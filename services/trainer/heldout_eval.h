#pragma once

// Held-out evaluation of the policy inside the trainer daemon: every
// `every_versions` published versions (and once before the first step),
// greedy exact-match accuracy on the first `problems` problems of the
// built-in task's held-out split, generated at temperature 0 by the engine
// the rollout worker runs. This is the learning signal the demo reports
// (the training reward is measured on sampled, not greedy, answers).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/config/config_schema.h"
#include "common/task/arith_task.h"
#include "common/task/tools_task.h"

namespace tandem::model {
class DecoderModel;
}
namespace tandem::tokenizer {
class Tokenizer;
}

namespace tandem::trainer {

struct HeldoutEvalConfig {
  // 0 disables evaluation.
  int64_t every_versions = 0;
  // "arith" (single answers, the default) or "tools": whole greedy
  // calculator episodes of the tools task (services/trainer/tools/sft/
  // tools_eval.h), with the model's own tokenizer and chat template.
  std::string task = "arith";
  // Tools task operand digits (as tandem-local's dataset, 4).
  int64_t tools_digits = 4;
  // 2048: the standard error of one evaluation is under 1 point (0.8
  // at 85% accuracy; 3 points with 256).
  int64_t problems = 2048;
  // Must match the coordinator's dataset.arith_* settings.
  int64_t arith_digits = 3;
  bool arith_subtraction = false;
  int64_t seed = 0;
};

void RegisterHeldoutEvalFields(config::ConfigSchema* schema,
                               HeldoutEvalConfig* config);

struct HeldoutResult {
  uint64_t policy_version = 0;
  int64_t correct = 0;
  int64_t total = 0;
  double seconds = 0.0;
  double accuracy() const {
    return total == 0 ? 0.0 : static_cast<double>(correct) / total;
  }
};

class HeldoutEvaluator {
 public:
  // Errors name the eval.* field that is out of range. `model_dir` is the
  // policy's Hugging Face directory, whose tokenizer and chat template the
  // tools task uses (unused for arith).
  static absl::StatusOr<std::unique_ptr<HeldoutEvaluator>> Create(
      const HeldoutEvalConfig& config, const std::string& model_dir = "");
  ~HeldoutEvaluator();

  // Whether `version` is due for an evaluation.
  bool Due(uint64_t version) const;

  // Greedy exact match of `policy` on the held-out problems; never changes
  // the model.
  absl::StatusOr<HeldoutResult> Evaluate(const model::DecoderModel& policy,
                                         uint64_t version) const;

 private:
  HeldoutEvaluator() = default;
  HeldoutEvalConfig config_;
  std::vector<task::ArithProblem> problems_;
  std::vector<task::ToolsProblem> tools_problems_;
  std::optional<chat::ChatTemplate> chat_template_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
};

}  // namespace tandem::trainer
