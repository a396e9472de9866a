#include "services/trainer/tools/sft/sft_eval.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/kv_cache.h"
#include "common/model/torch_status.h"
#include "common/task/arith_tokenizer.h"
#include "engine/generate_all.h"
#include "engine/torch_engine_model.h"
#include "services/trainer/tools/sft/sft_data.h"

namespace tandem::trainer::sft {
namespace {

// Argmax of each row of float32 logits [B, vocab].
std::vector<int32_t> ArgmaxRows(const at::Tensor& logits) {
  const at::Tensor best = logits.argmax(/*dim=*/-1).to(torch::kInt64).cpu();
  std::vector<int32_t> out(best.numel());
  const int64_t* p = best.data_ptr<int64_t>();
  for (int64_t i = 0; i < best.numel(); ++i) {
    out[i] = static_cast<int32_t>(p[i]);
  }
  return out;
}

absl::Status CompleteBatch(const model::DecoderModel& model,
                           const tokenizer::Tokenizer& tokenizer,
                           absl::Span<const task::ArithProblem> problems,
                           int64_t max_new_tokens,
                           std::vector<GreedyCompletion>* out) {
  const auto weights = model.weights();
  const model::ModelConfig& config = weights->config();
  const size_t n = problems.size();
  std::vector<std::vector<int32_t>> prompts(n);
  std::vector<std::unique_ptr<model::ContiguousKvCache>> caches(n);
  std::vector<model::SequenceStep> steps(n);
  for (size_t i = 0; i < n; ++i) {
    prompts[i] = PromptTokens(tokenizer, problems[i]);
    const int64_t needed =
        static_cast<int64_t>(prompts[i].size()) + max_new_tokens;
    ASSIGN_OR_RETURN(caches[i], model::ContiguousKvCache::Create(
                                    config, weights->dtype(), weights->device(),
                                    config.max_position_embeddings, needed));
    steps[i] = {prompts[i], caches[i].get()};
  }
  std::vector<GreedyCompletion> completions(n);
  ASSIGN_OR_RETURN(at::Tensor logits, model.ForwardWithCache(steps));
  std::vector<int32_t> next = ArgmaxRows(logits);
  // Sequences still generating, by index into `problems`.
  std::vector<size_t> active(n);
  for (size_t i = 0; i < n; ++i) active[i] = i;
  for (int64_t t = 0; t < max_new_tokens && !active.empty(); ++t) {
    std::vector<size_t> still;
    std::vector<int32_t> feed;
    std::vector<model::KvCache*> feed_caches;
    for (size_t k = 0; k < active.size(); ++k) {
      const size_t i = active[k];
      if (next[k] == task::kArithEosId) {
        completions[i].stopped = true;
        continue;
      }
      completions[i].tokens.push_back(next[k]);
      const int64_t length = caches[i]->num_tokens() + 1;
      if (t + 1 == max_new_tokens || length >= config.max_position_embeddings) {
        continue;
      }
      still.push_back(i);
      feed.push_back(next[k]);
      feed_caches.push_back(caches[i].get());
    }
    active = std::move(still);
    if (active.empty()) break;
    ASSIGN_OR_RETURN(logits, model.DecodeStep(feed, feed_caches));
    next = ArgmaxRows(logits);
  }
  for (GreedyCompletion& c : completions) {
    c.text = tokenizer.Decode(c.tokens);
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t MaxAnswerTokens(int digits) { return digits + 2; }

absl::StatusOr<std::vector<GreedyCompletion>> GreedyCompleteLoopForTest(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    absl::Span<const task::ArithProblem> problems, int64_t max_new_tokens,
    int64_t batch_size) {
  if (max_new_tokens < 1 || batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GreedyComplete: max_new_tokens (", max_new_tokens,
                     ") and batch_size (", batch_size, ") must be >= 1"));
  }
  std::vector<GreedyCompletion> out;
  out.reserve(problems.size());
  try {
    c10::InferenceMode guard;
    for (size_t begin = 0; begin < problems.size(); begin += batch_size) {
      const size_t count =
          std::min(problems.size() - begin, static_cast<size_t>(batch_size));
      RETURN_IF_ERROR(CompleteBatch(model, tokenizer,
                                    problems.subspan(begin, count),
                                    max_new_tokens, &out));
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("greedy evaluation", e);
  }
  return out;
}

absl::StatusOr<std::vector<GreedyCompletion>> GreedyComplete(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    absl::Span<const task::ArithProblem> problems, int64_t max_new_tokens,
    int64_t batch_size) {
  if (max_new_tokens < 1 || max_new_tokens > INT32_MAX || batch_size < 1 ||
      batch_size > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GreedyComplete: max_new_tokens (", max_new_tokens,
                     ") and batch_size (", batch_size,
                     ") must be in [1, 2^31)"));
  }
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(problems.size());
  int64_t longest_prompt = 1;
  for (const task::ArithProblem& problem : problems) {
    prompts.push_back(PromptTokens(tokenizer, problem));
    longest_prompt =
        std::max<int64_t>(longest_prompt, prompts.back().size());
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
    return absl::InternalError(absl::StrCat(
        "greedy evaluation: ", samples.size(), " completions for ",
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
