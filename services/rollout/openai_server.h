#pragma once

// The rollout worker's OpenAI-compatible HTTP/1.1 endpoint (Boost.Beast):
// GET /v1/models, POST /v1/completions and POST /v1/chat/completions,
// streaming (Server-Sent Events over chunked transfer encoding) or not.
// Requests are tokenized here (chat messages rendered with the model's own
// chat template, common/chat) and handed to a ServingQueue, whose requests
// the worker's engine thread runs in the same continuous batch as its RL
// rollouts. docs/openai-endpoint.md is the user's reference.
//
// Threads: one io thread of its own runs every connection; it never waits
// for the engine (progress arrives as posted callbacks). Bounds: at most
// `max_connections` open connections (one more is answered 503 and
// closed), request bodies of at most `max_body_bytes` (413), a request
// header within 60 s, and `request_timeout` for a generation (the sequence
// is cancelled; 504, or an error event in a stream). A client that closes
// its connection mid-generation (streaming or not) cancels its sequences.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/chat/chat_template.h"
#include "services/rollout/harness_episodes.h"
#include "services/rollout/openai_prompt.h"
#include "services/rollout/openai_protocol.h"
#include "services/rollout/serving_queue.h"

namespace tandem::tokenizer {
class Tokenizer;
}  // namespace tandem::tokenizer

namespace tandem::rollout {

struct OpenAIServerOptions {
  // host:port; port 0 picks a free one.
  std::string listen;
  // The id /v1/models lists and responses carry.
  std::string model_id;
  // The model's context and vocabulary, and the default max_tokens.
  PromptLimits prompt;
  int32_t max_connections = 64;
  size_t max_body_bytes = 4 << 20;
  absl::Duration request_timeout = absl::Seconds(600);
  openai::RequestLimits limits;
  // Harness-driven episodes (/tandem/v1/episodes routes, requests with
  // tandem_episode_id); null when openai.harness_environment is unset. Must
  // outlive the server.
  HarnessEpisodes* harness = nullptr;
  // How the model writes tool calls (environment.tool_call_format): chat
  // requests with `tools` get them parsed into `tool_calls`.
  chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kHermes;
};

class OpenAIServer {
 public:
  // Binds and starts serving. `tokenizer` and `queue` must outlive the
  // server. `templates` holds the model's chat templates, or is null with
  // `no_chat_reason` saying why chat requests are refused (400).
  // `policy_version` returns the live policy version (any thread).
  static absl::StatusOr<std::unique_ptr<OpenAIServer>> Create(
      OpenAIServerOptions options, const tokenizer::Tokenizer* tokenizer,
      std::shared_ptr<const chat::LoadedChatTemplates> templates,
      std::string no_chat_reason, ServingQueue* queue,
      std::function<uint64_t()> policy_version);
  // Stops the io thread and closes every connection (their requests are
  // cancelled).
  ~OpenAIServer();

  // host:port actually bound.
  const std::string& bound_address() const { return bound_address_; }

  class Impl;

 private:
  OpenAIServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string bound_address_;
};

}  // namespace tandem::rollout
