#include "services/rollout/openai_prompt.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem::rollout {

std::variant<PreparedRequest, openai::ApiError> PrepareRequest(
    const openai::CompletionRequest& request,
    const tokenizer::Tokenizer& tokenizer,
    const chat::LoadedChatTemplates* templates,
    const std::string& no_chat_reason, const PromptLimits& limits) {
  std::vector<int32_t> prompt;
  if (request.endpoint == openai::Endpoint::kChatCompletions) {
    if (templates == nullptr) {
      return openai::ApiError{.message = no_chat_reason, .param = "messages"};
    }
    absl::StatusOr<const chat::ChatTemplate*> tmpl = templates->Get();
    if (!tmpl.ok()) {
      return openai::ApiError{.message = std::string(tmpl.status().message()),
                              .param = "messages"};
    }
    chat::ChatTemplateInputs inputs;
    inputs.messages = request.messages;
    inputs.tools = request.tools;
    inputs.add_generation_prompt = request.add_generation_prompt;
    inputs.extra = request.chat_template_kwargs;
    absl::StatusOr<std::string> text =
        chat::ApplyChatTemplate(**tmpl, inputs, templates->special_tokens);
    if (!text.ok()) {
      return openai::ApiError{
          .message = absl::StrCat("the chat template failed on these "
                                  "messages: ",
                                  text.status().message()),
          .param = "messages"};
    }
    prompt = tokenizer.Encode(*text, /*parse_special=*/true);
  } else if (request.prompt_is_ids) {
    prompt = request.prompt_ids;
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] >= limits.vocab_size) {
        return openai::ApiError{
            .message = absl::StrCat("prompt[", i, "] = ", prompt[i],
                                    " is not a token id of this model "
                                    "(vocabulary of ",
                                    limits.vocab_size, ")"),
            .param = "prompt"};
      }
    }
  } else {
    prompt = tokenizer.Encode(request.prompt_text,
                              /*parse_special=*/true);
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len == 0) {
    return openai::ApiError{.message = "the prompt encodes to no tokens",
                            .param = "prompt"};
  }
  if (prompt_len >= limits.context_tokens) {
    return openai::ApiError{
        .message = absl::StrCat("the prompt is ", prompt_len,
                                " tokens; this model's context is ",
                                limits.context_tokens,
                                " tokens, which leaves no room for "
                                "a completion"),
        .param = "prompt",
        .code = "context_length_exceeded"};
  }
  // Completions default to openai.default_max_tokens (OpenAI's 16); chat
  // to whatever the context leaves, as OpenAI's chat does.
  int64_t max_tokens = request.endpoint == openai::Endpoint::kChatCompletions
                           ? limits.context_tokens - prompt_len
                           : std::min(limits.default_max_tokens,
                                      limits.context_tokens - prompt_len);
  if (request.max_tokens) {
    if (prompt_len + *request.max_tokens > limits.context_tokens) {
      return openai::ApiError{
          .message = absl::StrCat(
              "the prompt (", prompt_len, " tokens) plus max_tokens (",
              *request.max_tokens, ") exceeds this model's context of ",
              limits.context_tokens, " tokens"),
          .param = "max_tokens",
          .code = "context_length_exceeded"};
    }
    max_tokens = *request.max_tokens;
  }
  engine::SamplingParams params;
  params.temperature = static_cast<float>(request.temperature);
  params.top_p = static_cast<float>(request.top_p);
  params.top_k = request.top_k;
  params.max_tokens = static_cast<int32_t>(max_tokens);
  params.stop_token_ids = request.stop_token_ids;
  // The engine takes seed 0 as "draw one"; any given seed is fixed.
  if (request.seed) {
    params.seed = *request.seed == 0 ? 0x9E3779B97F4A7C15ull : *request.seed;
  }
  params.n = request.n;
  params.report_tokens = true;
  return PreparedRequest{std::move(prompt), params};
}

}  // namespace tandem::rollout
