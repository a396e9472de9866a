#pragma once

// A model's chat template (the Jinja template in tokenizer_config.json),
// parsed once and rendered the way Hugging Face transformers'
// `tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
// tokenize=False, **kwargs)` renders it: same whitespace handling
// (trim_blocks, lstrip_blocks), same tojson formatting, same context.
//
// The supported Jinja subset, and how it is checked against jinja2, is in
// docs/chat-templates.md.
//
// Thread safety: a ChatTemplate is immutable after Parse; Render may be
// called from any number of threads at once.

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/chat/jinja_renderer.h"
#include "common/chat/value.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

class ChatTemplate {
 public:
  // `name` appears in every error ("qwen3:12:5: unclosed block ...").
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source,
                                            std::string name = "chat_template");

  // Renders with `context` (a dict) as the template's global variables.
  absl::StatusOr<std::string> Render(const Value& context,
                                     const RenderLimits& limits = {}) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderLimits& limits = {}) const;

  const std::string& name() const;
  const std::string& source() const;

 private:
  struct Parsed;
  explicit ChatTemplate(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const Parsed> parsed_;
};

// What one apply_chat_template call passes besides the template.
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // A JSON array of tool schemas, or null for no tools (the template then
  // sees `tools` as none, as with transformers).
  nlohmann::ordered_json tools = nullptr;
  bool add_generation_prompt = false;
  // Extra template variables (transformers' **kwargs), e.g.
  // {"enable_thinking": false}. They override special tokens of the same name.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

// A tokenizer directory's chat template(s) and special tokens.
struct LoadedChatTemplates {
  // Keyed by template name; a single-string template is "default".
  std::map<std::string, ChatTemplate> templates;
  // bos_token, eos_token, unk_token, pad_token, ... as strings.
  std::map<std::string, std::string> special_tokens;

  // The "default" template, or the one named `name`.
  absl::StatusOr<const ChatTemplate*> Get(std::string_view name = "default") const;
};

// Reads `tokenizer_config.json` in `tokenizer_dir` (chat_template as a string
// or as a list of {"name", "template"}), and `chat_template.jinja` or
// `additional_chat_templates/*.jinja` where newer transformers save them
// (those win over the config, as in transformers).
absl::StatusOr<LoadedChatTemplates> LoadChatTemplates(const std::string& tokenizer_dir);

// Builds the context transformers builds (messages with None-valued keys
// dropped and reasoning fields aliased, tools, documents=None,
// add_generation_prompt, special tokens, extra) and renders `tmpl` with it.
absl::StatusOr<std::string> ApplyChatTemplate(
    const ChatTemplate& tmpl, const ChatTemplateInputs& inputs,
    const std::map<std::string, std::string>& special_tokens = {},
    const RenderLimits& limits = {});

// The context ApplyChatTemplate renders with, for callers that render twice.
absl::StatusOr<nlohmann::ordered_json> BuildChatTemplateContext(
    const ChatTemplateInputs& inputs, const std::map<std::string, std::string>& special_tokens);

}  // namespace tandem::chat
