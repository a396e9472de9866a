#include "services/trainer/heldout_eval.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/task/arith_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "services/trainer/tools/sft/sft_eval.h"
#include "services/trainer/tools/sft/tools_eval.h"

namespace tandem::trainer {

void RegisterHeldoutEvalFields(config::ConfigSchema* schema,
                               HeldoutEvalConfig* config) {
  schema->AddInt("eval.every_versions", &config->every_versions, 0, 1 << 30,
                 "Greedy held-out accuracy every this many policy versions "
                 "(and before the first step); 0 disables it.");
  schema->AddEnum("eval.task", &config->task, {"arith", "tools"},
                  "Held-out task: arith (single answers) or tools (greedy "
                  "calculator episodes, tandem-local --task tools).");
  schema->AddInt("eval.tools_digits", &config->tools_digits, 2, 9,
                 "Tools task operand digits.");
  schema->AddInt("eval.problems", &config->problems, 1, 1 << 20,
                 "Held-out problems per evaluation.");
  schema->AddInt("eval.arith_digits", &config->arith_digits, 1, 18,
                 "Built-in task digits (as the coordinator's "
                 "dataset.arith_digits).");
  schema->AddBool("eval.arith_subtraction", &config->arith_subtraction,
                  "Built-in task subtraction (as the coordinator's "
                  "dataset.arith_subtraction).");
  schema->AddInt("eval.seed", &config->seed, 0, INT64_MAX,
                 "Built-in task seed (as the coordinator's dataset.seed).");
}

HeldoutEvaluator::~HeldoutEvaluator() = default;

absl::StatusOr<std::unique_ptr<HeldoutEvaluator>> HeldoutEvaluator::Create(
    const HeldoutEvalConfig& config, const std::string& model_dir) {
  if (config.task == "tools") {
    task::ToolsTaskOptions options;
    options.digits = static_cast<int>(config.tools_digits);
    options.seed = static_cast<uint64_t>(config.seed);
    absl::StatusOr<task::ToolsTask> tools = task::ToolsTask::Create(options);
    if (!tools.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval: ", tools.status().message()));
    }
    if (model_dir.empty()) {
      return absl::InvalidArgumentError(
          "eval.task tools needs model.path (a directory with the task's "
          "tokenizer.json and chat template)");
    }
    std::unique_ptr<HeldoutEvaluator> evaluator(new HeldoutEvaluator());
    evaluator->config_ = config;
    evaluator->tools_problems_ = tools->Take(
        task::Split::kHeldOut, static_cast<uint64_t>(config.problems));
    ASSIGN_OR_RETURN(evaluator->tokenizer_, tokenizer::Tokenizer::FromFile(
                                                model_dir + "/tokenizer.json"));
    ASSIGN_OR_RETURN(chat::LoadedChatTemplates templates,
                     chat::LoadChatTemplates(model_dir));
    ASSIGN_OR_RETURN(const chat::ChatTemplate* tmpl, templates.Get());
    evaluator->chat_template_ = *tmpl;
    return evaluator;
  }
  task::ArithTaskOptions options;
  options.digits = static_cast<int>(config.arith_digits);
  options.subtraction = config.arith_subtraction;
  options.seed = static_cast<uint64_t>(config.seed);
  absl::StatusOr<task::ArithTask> task = task::ArithTask::Create(options);
  if (!task.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval: ", task.status().message()));
  }
  std::unique_ptr<HeldoutEvaluator> evaluator(new HeldoutEvaluator());
  evaluator->config_ = config;
  evaluator->problems_ =
      task->Take(task::Split::kHeldOut, static_cast<uint64_t>(config.problems));
  ASSIGN_OR_RETURN(evaluator->tokenizer_, task::LoadArithTokenizer());
  return evaluator;
}

bool HeldoutEvaluator::Due(uint64_t version) const {
  return config_.every_versions > 0 &&
         version % static_cast<uint64_t>(config_.every_versions) == 0;
}

absl::StatusOr<HeldoutResult> HeldoutEvaluator::Evaluate(
    const model::DecoderModel& policy, uint64_t version) const {
  const absl::Time start = absl::Now();
  if (config_.task == "tools") {
    ASSIGN_OR_RETURN(
        const sft::ToolsEvalResult tools,
        sft::EvaluateToolsEpisodes(policy, *tokenizer_, *chat_template_,
                                   tools_problems_));
    HeldoutResult out;
    out.policy_version = version;
    out.correct = tools.correct;
    out.total = tools.total;
    out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }
  ASSIGN_OR_RETURN(
      sft::EvalResult result,
      sft::EvaluateExactMatch(policy, *tokenizer_, problems_,
                              static_cast<int>(config_.arith_digits)));
  HeldoutResult out;
  out.policy_version = version;
  out.correct = result.correct;
  out.total = result.total;
  out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return out;
}

}  // namespace tandem::trainer
