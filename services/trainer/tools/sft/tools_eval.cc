#include "services/trainer/tools/sft/tools_eval.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/episode_render.h"
#include "common/chat/tool_calls.h"
#include "common/environment/calculator.h"
#include "common/model/torch_status.h"
#include "common/task/tools_demonstration.h"
#include "common/task/tools_tokenizer.h"
#include "engine/generate_all.h"
#include "engine/torch_engine_model.h"

namespace tandem::trainer::sft {
namespace {

using Json = nlohmann::ordered_json;

// Greedy continuations of `prompts`, each stopping at one of `stop_ids`.
absl::StatusOr<std::vector<engine::FinishedSample>> Greedy(
    const model::DecoderModel& model,
    const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<int32_t>& stop_ids, int64_t max_new_tokens,
    int64_t batch_size) {
  if (prompts.empty()) return std::vector<engine::FinishedSample>{};
  int64_t longest_prompt = 1;
  for (const auto& p : prompts) {
    longest_prompt = std::max<int64_t>(longest_prompt, p.size());
  }
  const int64_t max_positions =
      model.weights()->config().max_position_embeddings;
  engine::GenerateAllOptions options;
  options.engine.limits.max_num_seqs = static_cast<int32_t>(batch_size);
  options.engine.limits.max_batched_tokens =
      static_cast<int32_t>(batch_size * longest_prompt);
  options.engine.block_size = 16;
  options.engine.num_kv_blocks = static_cast<int32_t>(
      batch_size * ((longest_prompt + max_new_tokens + 15) / 16));
  options.params.temperature = 0.0f;
  options.params.max_tokens = static_cast<int32_t>(max_new_tokens);
  options.params.stop_token_ids = stop_ids;
  options.params.seed = 1;
  options.max_sequence_tokens = max_positions;
  engine::TorchEngineModel engine_model(
      std::shared_ptr<const model::DecoderModel>(
          std::shared_ptr<const model::DecoderModel>(), &model),
      max_positions);
  try {
    c10::InferenceMode guard;
    return engine::GenerateAll(&engine_model, prompts, options);
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("tools evaluation", e);
  }
}

bool EndsWith(const std::vector<int32_t>& tokens, int32_t id) {
  return !tokens.empty() && tokens.back() == id;
}

}  // namespace

absl::StatusOr<ToolsEvalResult> EvaluateToolsEpisodes(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    const chat::ChatTemplate& tmpl,
    absl::Span<const task::ToolsProblem> problems, int64_t max_turn_tokens,
    int64_t batch_size) {
  if (max_turn_tokens < 1 || batch_size < 1 || batch_size > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tools evaluation: max_turn_tokens (", max_turn_tokens,
        ") must be >= 1 and batch_size (", batch_size, ") in [1, 4096]"));
  }
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(problems.size());
  for (const task::ToolsProblem& problem : problems) {
    ASSIGN_OR_RETURN(const std::string prompt,
                     task::RenderToolsPrompt(tmpl, problem));
    prompts.push_back(tokenizer.Encode(prompt));
  }
  ASSIGN_OR_RETURN(
      std::vector<engine::FinishedSample> first,
      Greedy(model, prompts, {task::kToolsCallCloseId, task::kToolsImEndId},
             max_turn_tokens, batch_size));
  if (first.size() != problems.size()) {
    return absl::InternalError(absl::StrCat("tools evaluation: ", first.size(),
                                            " first turns for ",
                                            problems.size(), " problems"));
  }
  const int64_t max_positions =
      model.weights()->config().max_position_embeddings;
  ToolsEvalResult result;
  result.total = static_cast<int64_t>(problems.size());
  // Episodes that called a tool go on to a second turn.
  std::vector<size_t> continued;
  std::vector<std::vector<int32_t>> prefixes;
  for (size_t i = 0; i < problems.size(); ++i) {
    const std::vector<int32_t>& turn = first[i].output;
    const std::string text = tokenizer.Decode(turn);
    if (EndsWith(turn, task::kToolsImEndId)) {
      if (task::ScoreToolsAnswer(problems[i], text)) ++result.correct;
      continue;
    }
    if (!EndsWith(turn, task::kToolsCallCloseId)) continue;  // token limit
    absl::StatusOr<chat::ParsedTurn> parsed =
        chat::ParseToolCalls(text, chat::ToolCallFormat::kHermes, "call_0_");
    std::string observation;
    std::string name = "calculator";
    if (!parsed.ok()) {
      observation =
          absl::StrCat("malformed tool call: ", parsed.status().message());
    } else if (parsed->calls.size() != 1 ||
               parsed->calls[0].name != "calculator") {
      observation = "error: expected one call of the tool 'calculator'";
    } else {
      ++result.called_tool;
      observation =
          environment::RunCalculatorCall(parsed->calls[0].arguments_json)
              .content;
    }
    const Json messages = Json::array({Json{{"role", "tool"},
                                            {"tool_call_id", "call_0_0"},
                                            {"name", name},
                                            {"content", observation}}});
    ASSIGN_OR_RETURN(
        const std::string continuation,
        chat::RenderContinuation(tmpl, messages, task::kToolsImEndToken));
    std::vector<int32_t> prefix = prompts[i];
    prefix.insert(prefix.end(), turn.begin(), turn.end());
    for (int32_t id :
         tokenizer.Encode(absl::StrCat(task::kToolsImEndToken, continuation))) {
      prefix.push_back(id);
    }
    // An episode whose observation leaves no room for an answer ends there,
    // wrong (the worker ends it with token_limit).
    if (static_cast<int64_t>(prefix.size()) + 2 > max_positions) continue;
    continued.push_back(i);
    prefixes.push_back(std::move(prefix));
  }
  ASSIGN_OR_RETURN(std::vector<engine::FinishedSample> second,
                   Greedy(model, prefixes, {task::kToolsImEndId},
                          max_turn_tokens, batch_size));
  if (second.size() != continued.size()) {
    return absl::InternalError(absl::StrCat("tools evaluation: ", second.size(),
                                            " answer turns for ",
                                            continued.size(), " episodes"));
  }
  for (size_t k = 0; k < continued.size(); ++k) {
    const std::vector<int32_t>& turn = second[k].output;
    if (!EndsWith(turn, task::kToolsImEndId)) continue;
    if (task::ScoreToolsAnswer(problems[continued[k]],
                               tokenizer.Decode(turn))) {
      ++result.correct;
    }
  }
  return result;
}

}  // namespace tandem::trainer::sft
