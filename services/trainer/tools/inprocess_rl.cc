#include "services/trainer/tools/inprocess_rl.h"

#include <cstdio>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_loader.h"
#include "common/model/model_weights.h"
#include "common/task/arith_task.h"
#include "common/task/arith_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/generate_all.h"
#include "engine/torch_engine_model.h"
#include "services/trainer/tools/sft/sft_eval.h"

namespace tandem::trainer {
namespace {

// Whether a sampled completion is the problem's answer followed by eos.
bool Correct(const std::vector<int32_t>& output,
             const std::vector<int32_t>& eos,
             const tokenizer::Tokenizer& tokenizer,
             const task::ArithProblem& problem) {
  sft::GreedyCompletion completion;
  completion.tokens = output;
  if (!completion.tokens.empty()) {
    for (int32_t e : eos) {
      if (completion.tokens.back() == e) {
        completion.tokens.pop_back();
        completion.stopped = true;
        break;
      }
    }
  }
  completion.text = tokenizer.Decode(completion.tokens);
  return sft::IsExactMatch(completion, problem);
}

}  // namespace

absl::StatusOr<InProcessRlResult> RunInProcessRl(
    const InProcessRlOptions& options,
    const std::function<void(const InProcessRlPoint&)>& on_point) {
  ASSIGN_OR_RETURN(
      model::LoadedModel loaded,
      model::LoadModel(options.model_path, 1,
                       static_cast<int32_t>(options.torch_threads)));
  task::ArithTaskOptions task_options;
  task_options.digits = options.digits;
  task_options.subtraction = options.subtraction;
  task_options.seed = options.seed;
  ASSIGN_OR_RETURN(task::ArithTask task, task::ArithTask::Create(task_options));
  const std::vector<task::ArithProblem> heldout = task.Take(
      task::Split::kHeldOut, static_cast<uint64_t>(options.eval_problems));
  ASSIGN_OR_RETURN(
      std::unique_ptr<GrpoTrainer> grpo,
      GrpoTrainer::Create(*loaded.decoder->weights(), 0, options.grpo));
  const tokenizer::Tokenizer& tokenizer = *loaded.tokenizer;

  InProcessRlResult result;
  const absl::Time start = absl::Now();
  double reward_sum = 0;
  int64_t reward_count = 0;
  // Step statistics summed since the previous evaluation.
  InProcessRlPoint sums;
  int64_t summed_steps = 0;
  auto evaluate = [&](int64_t step) -> absl::Status {
    ASSIGN_OR_RETURN(sft::EvalResult eval,
                     sft::EvaluateExactMatch(grpo->policy(), tokenizer, heldout,
                                             options.digits));
    InProcessRlPoint point;
    point.step = step;
    point.heldout_accuracy = eval.accuracy();
    point.reward_mean = reward_count > 0 ? reward_sum / reward_count : 0.0;
    point.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (summed_steps > 0) {
      const double n = static_cast<double>(summed_steps);
      point.entropy_mean = sums.entropy_mean / n;
      point.clip_fraction = sums.clip_fraction / n;
      point.ratio_mean = sums.ratio_mean / n;
      point.grad_norm = sums.grad_norm / n;
      point.signal_fraction = sums.signal_fraction / n;
    }
    reward_sum = 0;
    reward_count = 0;
    sums = InProcessRlPoint();
    summed_steps = 0;
    result.curve.push_back(point);
    if (on_point) on_point(point);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(evaluate(0));
  uint64_t problem_index = 0;
  for (int64_t step = 1; step <= options.steps; ++step) {
    const absl::Time generate_start = absl::Now();
    ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> weights,
                     grpo->SnapshotWeights());
    auto decoder = std::make_shared<model::DecoderModel>(std::move(weights));
    engine::TorchEngineModel engine_model(decoder, loaded.max_tokens);
    engine::GenerateAllOptions generate;
    generate.engine.eos_token_ids = loaded.eos_token_ids;
    generate.engine.limits.max_num_seqs =
        static_cast<int32_t>(options.prompts_per_step * options.group_size);
    generate.params.temperature = static_cast<float>(options.temperature);
    generate.params.max_tokens = sft::MaxAnswerTokens(options.digits) + 1;
    generate.params.n = options.group_size;
    std::vector<task::ArithProblem> problems;
    std::vector<ScoredPromptGroup> groups;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t p = 0; p < options.prompts_per_step; ++p) {
      task::ArithProblem problem =
          task.Sample(task::Split::kTrain, problem_index++);
      // As the coordinator's built-in source: [<|bos|>] + "a+b=".
      std::vector<int32_t> prompt = {task::kArithBosId};
      for (int32_t id : tokenizer.Encode(problem.prompt)) prompt.push_back(id);
      generate.seeds.push_back(options.seed * 1000003 + problem_index * 131 +
                               1);
      ScoredPromptGroup group;
      group.prompt = prompt;
      group.temperature = options.temperature;
      groups.push_back(std::move(group));
      problems.push_back(std::move(problem));
      prompts.push_back(std::move(prompt));
    }
    ASSIGN_OR_RETURN(std::vector<engine::FinishedSample> samples,
                     engine::GenerateAll(&engine_model, prompts, generate));
    for (engine::FinishedSample& finished : samples) {
      // GenerateAll orders samples by prompt (its request id).
      const size_t p = std::stoul(finished.request_id);
      ScoredCompletion c;
      c.reward =
          Correct(finished.output, loaded.eos_token_ids, tokenizer, problems[p])
              ? 1.0
              : 0.0;
      c.tokens = std::move(finished.output);
      c.behavior_logprobs = std::move(finished.logprobs);
      c.min_policy_version = grpo->policy_version();
      reward_sum += c.reward;
      ++reward_count;
      groups[p].completions.push_back(std::move(c));
    }
    const absl::Time train_start = absl::Now();
    result.generate_seconds +=
        absl::ToDoubleSeconds(train_start - generate_start);
    int64_t with_signal = 0;
    for (const ScoredPromptGroup& group : groups) {
      for (const ScoredCompletion& c : group.completions) {
        if (c.reward != group.completions.front().reward) {
          ++with_signal;
          break;
        }
      }
    }
    ASSIGN_OR_RETURN(const GrpoStepStats stats, grpo->Step(groups));
    if (stats.skipped()) {
      std::fprintf(stderr,
                   "rl-inprocess: step %lld skipped: its %s is not "
                   "finite\n",
                   static_cast<long long>(step), stats.nonfinite.c_str());
      continue;
    }
    sums.entropy_mean += stats.loss.entropy_mean;
    sums.clip_fraction += stats.loss.clip_fraction;
    sums.ratio_mean += stats.loss.ratio_mean;
    sums.grad_norm += stats.grad_norm;
    sums.signal_fraction +=
        static_cast<double>(with_signal) / static_cast<double>(groups.size());
    ++summed_steps;
    result.train_seconds += absl::ToDoubleSeconds(absl::Now() - train_start);
    if (options.eval_every > 0 && step % options.eval_every == 0) {
      RETURN_IF_ERROR(evaluate(step));
    }
  }
  return result;
}

int RunInProcessRlCommand(int argc, char** argv) {
  InProcessRlOptions options;
  CLI::App app{
      "GRPO on the built-in arithmetic task with an in-process rollout (no "
      "daemons): calibrates RL settings and shows the algorithm learns."};
  app.add_option("--model", options.model_path,
                 "Start policy: Hugging Face directory (e.g. the warm start)")
      ->required();
  app.add_option("--digits", options.digits, "Operand digits");
  app.add_option("--subtraction", options.subtraction, "Include '-'");
  app.add_option("--seed", options.seed, "Problem and sampling seed");
  app.add_option("--steps", options.steps, "Optimizer steps");
  app.add_option("--prompts", options.prompts_per_step, "Prompts per step");
  app.add_option("--group-size", options.group_size, "Samples per prompt");
  app.add_option("--temperature", options.temperature, "Sampling temperature");
  app.add_option("--eval-every", options.eval_every, "Steps between evals");
  app.add_option("--eval-problems", options.eval_problems,
                 "Held-out problems per evaluation");
  app.add_option("--lr", options.grpo.lr, "AdamW learning rate");
  app.add_option("--beta2", options.grpo.beta2, "AdamW beta2");
  app.add_option("--threads", options.torch_threads, "torch threads");
  app.add_option("--max-grad-norm", options.grpo.max_grad_norm,
                 "Gradient clipping norm");
  app.add_option("--skip-zero-advantage", options.grpo.skip_zero_advantage,
                 "Do not forward completions whose advantage is 0");
  app.add_option("--dynamic-sampling", options.grpo.drop_uniform_groups,
                 "Leave groups whose rewards are all equal out of the step");
  app.add_option("--warmup-steps", options.grpo.warmup_steps,
                 "Linear learning-rate warmup steps");
  std::string schedule = "constant";
  app.add_option("--schedule", schedule,
                 "Learning rate after the warmup (decays to "
                 "lr * --min-lr-ratio at --steps)")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}));
  app.add_option("--min-lr-ratio", options.grpo.min_lr_ratio,
                 "Final learning rate of a decaying schedule, as a fraction "
                 "of --lr");
  app.add_option("--clip-low", options.grpo.loss.clip_low, "PPO clip below 1");
  app.add_option("--clip-high", options.grpo.loss.clip_high,
                 "PPO clip above 1");
  std::string advantage = "grpo";
  app.add_option("--advantage", advantage,
                 "grpo: (r - mean) / std; dr-grpo: r - mean")
      ->check(CLI::IsMember({"grpo", "dr-grpo"}));
  std::string aggregation = "token-mean";
  app.add_option("--aggregation", aggregation, "Loss aggregation over tokens")
      ->check(CLI::IsMember({"token-mean", "sequence-mean", "sum"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.grpo.schedule = schedule == "cosine"   ? LrSchedule::kCosine
                          : schedule == "linear" ? LrSchedule::kLinear
                                                 : LrSchedule::kConstant;
  options.grpo.total_steps = options.steps;
  options.grpo.loss.advantage = advantage == "grpo"
                                    ? AdvantageNormalization::kGroupMeanStd
                                    : AdvantageNormalization::kGroupMean;
  options.grpo.loss.aggregation =
      aggregation == "token-mean"      ? LossAggregation::kTokenMean
      : aggregation == "sequence-mean" ? LossAggregation::kSequenceMean
                                       : LossAggregation::kSumOverSequences;
  absl::StatusOr<InProcessRlResult> result =
      RunInProcessRl(options, [](const InProcessRlPoint& p) {
        std::printf(
            "step %ld: held-out %.3f, reward %.3f, entropy %.3f, groups "
            "with signal %.2f, clipped %.3f, ratio %.4f, grad norm %.3f, "
            "%.1fs\n",
            static_cast<long>(p.step), p.heldout_accuracy, p.reward_mean,
            p.entropy_mean, p.signal_fraction, p.clip_fraction, p.ratio_mean,
            p.grad_norm, p.seconds);
        std::fflush(stdout);
      });
  if (!result.ok()) {
    std::fprintf(stderr, "rl-inprocess: %s\n",
                 std::string(result.status().message()).c_str());
    return 1;
  }
  std::printf("generate %.1fs, train %.1fs\n", result->generate_seconds,
              result->train_seconds);
  return 0;
}

}  // namespace tandem::trainer
