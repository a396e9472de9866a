// RolloutWorker::StartOpenAIServer: the OpenAI-compatible endpoint
// (openai_server.h) over the worker's tokenizer, chat templates and
// ServingQueue. Kept apart from rollout_worker.cc, which is about leases.

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "services/rollout/rollout_worker.h"

namespace tandem::rollout {

absl::Status RolloutWorker::StartOpenAIServer() {
  if (config_.openai_listen.empty()) return absl::OkStatus();
  OpenAIServerOptions o;
  o.listen = config_.openai_listen;
  o.model_id = config_.openai_model_name;
  if (o.model_id.empty() && config_.model_path.empty()) {
    o.model_id = "tandem-arith";
  } else if (o.model_id.empty()) {
    std::filesystem::path dir(config_.model_path);
    if (!dir.has_filename()) dir = dir.parent_path();  // a trailing '/'
    o.model_id = dir.filename().string();
  }
  o.prompt = {.context_tokens = model_.max_tokens,
              .vocab_size = engine_model_->vocab_size(),
              .default_max_tokens = config_.openai_default_max_tokens};
  o.max_connections = static_cast<int32_t>(config_.openai_max_connections);
  o.max_body_bytes = static_cast<size_t>(config_.openai_max_body_bytes);
  o.request_timeout = absl::Seconds(config_.openai_request_timeout_s);
  o.limits.max_n = static_cast<int32_t>(config_.openai_max_n);
  if (absl::StatusOr<chat::ToolCallFormat> format =
          chat::ToolCallFormatFromName(config_.environment_tool_call_format);
      format.ok()) {
    o.tool_call_format = *format;
  }
  if (!config_.openai_harness_environment.empty()) {
    HarnessOptions h;
    h.idle_timeout = absl::Seconds(config_.openai_harness_idle_timeout_s);
    h.max_episodes = static_cast<int32_t>(config_.openai_harness_max_episodes);
    h.clock = clock_;
    if (config_.openai_harness_max_episode_s > 0) {
      h.max_lifetime = absl::Seconds(config_.openai_harness_max_episode_s);
    }
    harness_ = std::make_unique<HarnessEpisodes>(h, [this] {
      absl::MutexLock lock(&mu_);
      return snapshot_.policy_version;
    });
    o.harness = harness_.get();
  }
  std::shared_ptr<const chat::LoadedChatTemplates> templates;
  std::string no_chat_reason;
  if (config_.model_path.empty()) {
    no_chat_reason =
        "the built-in arithmetic model has no chat template; use "
        "/v1/completions with a plain prompt";
  } else {
    absl::StatusOr<chat::LoadedChatTemplates> loaded =
        chat::LoadChatTemplates(config_.model_path);
    if (loaded.ok() && loaded->Get().ok()) {
      templates =
          std::make_shared<const chat::LoadedChatTemplates>(*std::move(loaded));
    } else {
      no_chat_reason =
          absl::StrCat("model '", o.model_id, "' has no usable chat template (",
                       loaded.ok() ? loaded->Get().status().message()
                                   : loaded.status().message(),
                       "); use /v1/completions");
    }
  }
  const bool chat = templates != nullptr;
  ASSIGN_OR_RETURN(
      openai_server_,
      OpenAIServer::Create(std::move(o), model_.tokenizer.get(),
                           std::move(templates), std::move(no_chat_reason),
                           &serving_, [this] {
                             absl::MutexLock lock(&mu_);
                             return snapshot_.policy_version;
                           }));
  ComponentLogger("rollout")->info(
      "OpenAI endpoint on http://{}/v1 (chat {}; harness episodes {})",
      openai_server_->bound_address(), chat ? "on" : "off",
      harness_ ? config_.openai_harness_environment : "off");
  return absl::OkStatus();
}

}  // namespace tandem::rollout
