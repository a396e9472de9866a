#include "common/task/tools_demonstration.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/episode_render.h"
#include "common/task/tools_tokenizer.h"

namespace tandem::task {
namespace {

using Json = nlohmann::ordered_json;

void Append(const std::vector<int32_t>& ids, std::vector<int32_t>* out) {
  out->insert(out->end(), ids.begin(), ids.end());
}

}  // namespace

absl::StatusOr<std::string> RenderToolsPrompt(const chat::ChatTemplate& tmpl,
                                              const ToolsProblem& problem) {
  chat::ChatTemplateInputs inputs;
  inputs.messages =
      Json::array({Json{{"role", "user"}, {"content", problem.expression}}});
  inputs.add_generation_prompt = true;
  return chat::ApplyChatTemplate(tmpl, inputs);
}

absl::StatusOr<ToolsDemonstration> MakeToolsDemonstration(
    const tokenizer::Tokenizer& tokenizer, const chat::ChatTemplate& tmpl,
    const ToolsProblem& problem) {
  ASSIGN_OR_RETURN(const std::string prompt, RenderToolsPrompt(tmpl, problem));
  const Json observations = Json::array({Json{{"role", "tool"},
                                              {"tool_call_id", "call_0_0"},
                                              {"name", "calculator"},
                                              {"content", problem.answer}}});
  ASSIGN_OR_RETURN(
      const std::string continuation,
      chat::RenderContinuation(tmpl, observations, kToolsImEndToken));

  ToolsDemonstration demo;
  Append(tokenizer.Encode(prompt), &demo.tokens);
  demo.prompt_tokens = static_cast<int64_t>(demo.tokens.size());
  const int64_t call_begin = demo.prompt_tokens;
  Append(tokenizer.Encode(ToolsCallTurn(problem)), &demo.tokens);
  demo.model_spans.emplace_back(call_begin,
                                static_cast<int64_t>(demo.tokens.size()));
  Append(tokenizer.Encode(absl::StrCat(kToolsImEndToken, continuation)),
         &demo.tokens);
  const int64_t answer_begin = static_cast<int64_t>(demo.tokens.size());
  Append(tokenizer.Encode(absl::StrCat(problem.answer, kToolsImEndToken)),
         &demo.tokens);
  demo.model_spans.emplace_back(answer_begin,
                                static_cast<int64_t>(demo.tokens.size()));
  return demo;
}

std::string ToolsDatasetRow(const std::string& prompt,
                            const ToolsProblem& problem) {
  const Json row = {{"id", problem.id},
                    {"prompt", prompt},
                    {"verifier", "exact"},
                    {"metadata", {{"answer", problem.answer}}},
                    {"environment", "calculator"}};
  return row.dump();
}

}  // namespace tandem::task
