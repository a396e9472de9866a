#pragma once

// The OpenAI-compatible HTTP API of the rollout worker, as data: parsing and
// validating /v1/completions and /v1/chat/completions request bodies, and
// building the JSON of responses, stream chunks, model lists and errors.
// No I/O and no engine here (openai_server.h serves it); every function is
// pure and thread-compatible.
//
// Validation follows OpenAI's contract where Tandem can honour it and says
// so where it cannot: a wrong type or an out-of-range value is a 400 whose
// message names the field and the value; fields OpenAI clients commonly
// send are accepted (and ignored where they do not change the result);
// fields that would change the result in a way the engine cannot (top
// log-prob alternatives, penalties, logit_bias, echo, suffix) are refused
// rather than silently ignored. docs/openai-endpoint.md lists them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/chat/tool_call_stream.h"
#include "common/chat/tool_calls.h"
#include "nlohmann/json.hpp"

namespace tandem::rollout::openai {

using Json = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChatCompletions };

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" for none
  std::string code;   // "" for null
};

// Bounds the parser enforces (the server passes its configured ones).
struct RequestLimits {
  int32_t max_n = 16;
  int32_t max_stop_strings = 4;
  size_t max_stop_bytes = 256;
  size_t max_prompt_token_ids = 1 << 20;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as sent ("" when absent)
  // /v1/completions: the prompt as text, or as token ids (prompt_is_ids).
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // /v1/chat/completions: the messages (validated: an array of objects with
  // a string role) and the optional tools, rendered by the chat template.
  Json messages = Json::array();
  Json tools = nullptr;
  // Whether the model's tool calls are parsed into `tool_calls`: the
  // request sends a non-empty `tools` and a `tool_choice` other than
  // "none".
  bool parse_tool_calls = false;
  bool add_generation_prompt = true;
  Json chat_template_kwargs = Json::object();
  // Unset: as many as the context leaves, capped by the server's default.
  std::optional<int64_t> max_tokens;
  double temperature = 1.0;
  double top_p = 1.0;
  int32_t top_k = 0;  // vLLM's extension; 0 = off
  int32_t n = 1;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // vLLM's extension
  // Completions: `logprobs` 0 asks for the sampled tokens' log-probs. Chat:
  // `logprobs: true` (top_logprobs must be 0).
  bool want_logprobs = false;
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  // Tandem's extension: the harness episode whose model turn this is
  // (docs/openai-endpoint.md, "Training a black-box agent"); "" for none.
  std::string episode_id;
};

// Parses a request body for `endpoint`. On failure fills `error` and
// returns nullopt.
std::optional<CompletionRequest> ParseCompletionRequest(
    Endpoint endpoint, std::string_view body, const RequestLimits& limits,
    ApiError* error);

Json ErrorBody(const ApiError& error);

// One finished (or, in a stream, partial) choice.
struct ChoiceResult {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<uint64_t> policy_versions;
  // The tokens' strings as written in tokenizer.json (logprobs.tokens).
  std::vector<std::string> token_strings;
  // "stop", "length", "tool_calls", or "" while unfinished.
  std::string finish_reason;
  // Chat with tools: the calls parsed from the model's text (`text` is then
  // the text outside them).
  std::vector<chat::ParsedToolCall> tool_calls;
  // A stream chunk of a chat with tools: the calls' parts new in this
  // chunk (a call's header, fragments of its arguments). A chunk that has
  // any carries them as `delta.tool_calls` instead of `tool_calls`.
  std::vector<chat::ToolCallStream::CallDelta> tool_call_deltas;
};

struct ResponseHeader {
  std::string id;  // cmpl-... / chatcmpl-...
  int64_t created = 0;
  std::string model;
};

// The non-streaming response body.
Json CompletionResponse(const CompletionRequest& request,
                        const ResponseHeader& header,
                        const std::vector<int32_t>& prompt_ids,
                        const std::vector<ChoiceResult>& choices);

// One stream chunk carrying `delta` (text and tokens new since the last
// chunk of that choice; finish_reason set on its last). `first` adds the
// role (chat) and prompt_token_ids.
Json StreamChunk(const CompletionRequest& request, const ResponseHeader& header,
                 const std::vector<int32_t>& prompt_ids,
                 const ChoiceResult& delta, bool first);

// The usage chunk (stream_options.include_usage): no choices.
Json UsageChunk(const CompletionRequest& request, const ResponseHeader& header,
                int64_t prompt_tokens, int64_t completion_tokens);

// GET /v1/models.
Json ModelList(const std::string& model_id, int64_t created,
               uint64_t policy_version, int64_t max_model_len);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string Dump(const Json& json);

}  // namespace tandem::rollout::openai
