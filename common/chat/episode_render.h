#pragma once

// The text a multi-turn episode appends after a model turn: the
// environment's messages (tool results, a user turn) and the next
// assistant header, as the model's own chat template renders them.
//
// Chat templates render whole conversations, and some render a message
// differently depending on its neighbours (Qwen groups consecutive tool
// messages under one user turn), so the continuation is the difference of
// two renderings of a fixed stand-in conversation: [user, assistant] and
// [user, assistant, observations...] with add_generation_prompt. The model's
// turn ended with the template's end-of-turn text (`turn_end`, e.g.
// "<|im_end|>", "<|eot_id|>"), which the engine already holds; the
// continuation is everything the second rendering has after that text's
// last occurrence in the first. Thread-safe (pure).

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

// `observations`: a JSON array of messages ({"role": "tool", "content",
// "tool_call_id", "name"} or {"role": "user", "content"}). `tools` and
// `extra` as in ChatTemplateInputs. FailedPrecondition when the template
// does not render the shorter conversation as a prefix of the longer one
// (up to `turn_end`), or when `turn_end` is not in the first rendering.
absl::StatusOr<std::string> RenderContinuation(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& observations,
    const std::string& turn_end, const nlohmann::ordered_json& tools = nullptr,
    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
    const std::map<std::string, std::string>& special_tokens = {});

// The text an episode's opening observations add to a prompt written
// without the generation header: the observations (user or tool messages)
// and the assistant header, as `tmpl` renders them after a user turn. The
// difference of two renderings of a stand-in conversation, [user] and
// [user, observations...] with add_generation_prompt; with no observations
// it is the generation header alone. FailedPrecondition when the first
// rendering is not a prefix of the second.
absl::StatusOr<std::string> RenderOpening(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& observations,
    const nlohmann::ordered_json& tools = nullptr,
    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
    const std::map<std::string, std::string>& special_tokens = {});

}  // namespace tandem::chat
