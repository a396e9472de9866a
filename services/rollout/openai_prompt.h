#pragma once

// What an OpenAI request asks the engine for: the prompt's token ids (the
// chat messages rendered with the model's chat template, a text prompt
// encoded, or token ids checked against the vocabulary) and the sampling
// parameters, with the context checks that refuse a request before it
// reaches the engine. No I/O: the HTTP server (openai_server.cc) calls it
// and writes the error it returns.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/sequence.h"
#include "services/rollout/openai_protocol.h"

namespace tandem::rollout {

struct PromptLimits {
  // Longest prompt + completion, in tokens (the model's context).
  int64_t context_tokens = 0;
  int32_t vocab_size = 0;
  // max_tokens of a completion request that leaves it out (capped by what
  // the context leaves); chat requests default to what the context leaves.
  int64_t default_max_tokens = 16;
};

struct PreparedRequest {
  std::vector<int32_t> prompt;
  engine::SamplingParams params;
};

// `templates` is null when the model has none; `no_chat_reason` says why
// chat requests are then refused.
std::variant<PreparedRequest, openai::ApiError> PrepareRequest(
    const openai::CompletionRequest& request,
    const tokenizer::Tokenizer& tokenizer,
    const chat::LoadedChatTemplates* templates,
    const std::string& no_chat_reason, const PromptLimits& limits);

}  // namespace tandem::rollout
