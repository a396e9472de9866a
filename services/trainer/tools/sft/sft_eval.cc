#include "services/trainer/tools/sft/sft_eval.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/torch_status.h"
#include "common/task/arith_tokenizer.h"
#include "engine/generate_all.h"
#include "engine/torch_engine_model.h"
#include "services/trainer/tools/sft/sft_data.h"

namespace tandem::trainer::sft {

int64_t MaxAnswerTokens(int digits) { return digits + 2; }

absl::StatusOr<std::vector<GreedyCompletion>> GreedyComplete(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    absl::Span<const task::ArithProblem> problems, int64_t max_new_tokens,
    int64_t batch_size) {
  if (max_new_tokens < 1 || max_new_tokens > INT32_MAX || batch_size < 1 ||
      batch_size > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GreedyComplete: max_new_tokens (", max_new_tokens,
        ") and batch_size (", batch_size, ") must be in [1, 2^31)"));
  }
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(problems.size());
  int64_t longest_prompt = 1;
  for (const task::ArithProblem& problem : problems) {
    prompts.push_back(PromptTokens(tokenizer, problem));
    longest_prompt = std::max<int64_t>(longest_prompt, prompts.back().size());
  }
  const int64_t max_positions =
      model.weights()->config().max_position_embeddings;
  engine::GenerateAllOptions options;
  // `batch_size` sequences at a time, each prompt prefilled in one piece;
  // KV blocks for all of them at their longest, so nothing is preempted.
  options.engine.limits.max_num_seqs = static_cast<int32_t>(batch_size);
  options.engine.limits.max_batched_tokens = static_cast<int32_t>(
      std::min<int64_t>(INT32_MAX, batch_size * longest_prompt));
  options.engine.block_size = 16;
  options.engine.num_kv_blocks = static_cast<int32_t>(std::min<int64_t>(
      INT32_MAX, batch_size * ((longest_prompt + max_new_tokens + 15) / 16)));
  options.params.temperature = 0.0f;
  options.params.max_tokens = static_cast<int32_t>(max_new_tokens);
  options.params.stop_token_ids = {task::kArithEosId};
  options.params.seed = 1;  // unused when greedy; spares a random_device
  options.max_sequence_tokens = max_positions;
  // The engine only reads the model, which the caller owns.
  engine::TorchEngineModel engine_model(
      std::shared_ptr<const model::DecoderModel>(
          std::shared_ptr<const model::DecoderModel>(), &model),
      max_positions);
  std::vector<engine::FinishedSample> samples;
  try {
    c10::InferenceMode guard;
    ASSIGN_OR_RETURN(samples,
                     engine::GenerateAll(&engine_model, prompts, options));
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("greedy evaluation", e);
  }
  if (samples.size() != problems.size()) {
    return absl::InternalError(
        absl::StrCat("greedy evaluation: ", samples.size(), " completions for ",
                     problems.size(), " problems"));
  }
  std::vector<GreedyCompletion> out(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    GreedyCompletion& c = out[i];
    c.tokens = std::move(samples[i].output);
    if (samples[i].finish_reason == engine::FinishReason::kStop &&
        !c.tokens.empty() && c.tokens.back() == task::kArithEosId) {
      c.tokens.pop_back();
      c.stopped = true;
    }
    c.text = tokenizer.Decode(c.tokens);
  }
  return out;
}

bool IsExactMatch(const GreedyCompletion& completion,
                  const task::ArithProblem& problem) {
  return completion.stopped && completion.text == problem.answer;
}

absl::StatusOr<EvalResult> EvaluateExactMatch(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    absl::Span<const task::ArithProblem> problems, int digits) {
  ASSIGN_OR_RETURN(
      std::vector<GreedyCompletion> completions,
      GreedyComplete(model, tokenizer, problems, MaxAnswerTokens(digits)));
  EvalResult result;
  result.total = static_cast<int64_t>(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    if (IsExactMatch(completions[i], problems[i])) ++result.correct;
  }
  return result;
}

}  // namespace tandem::trainer::sft
