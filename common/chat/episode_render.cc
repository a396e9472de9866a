#include "common/chat/episode_render.h"

#include "absl/strings/str_cat.h"

namespace tandem::chat {

absl::StatusOr<std::string> RenderContinuation(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& observations,
    const std::string& turn_end, const nlohmann::ordered_json& tools,
    const nlohmann::ordered_json& extra,
    const std::map<std::string, std::string>& special_tokens) {
  if (!observations.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "observations must be a JSON array, got ", observations.type_name()));
  }
  ChatTemplateInputs before;
  before.messages = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "U"}},
       {{"role", "assistant"}, {"content", "A"}}});
  before.tools = tools;
  before.extra = extra;
  ChatTemplateInputs after = before;
  for (const auto& message : observations) after.messages.push_back(message);
  after.add_generation_prompt = true;
  absl::StatusOr<std::string> first =
      ApplyChatTemplate(tmpl, before, special_tokens);
  if (!first.ok()) return first.status();
  absl::StatusOr<std::string> second =
      ApplyChatTemplate(tmpl, after, special_tokens);
  if (!second.ok()) return second.status();
  const size_t end =
      turn_end.empty() ? std::string::npos : first->rfind(turn_end);
  if (end == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", tmpl.name(), ": the end-of-turn text \"", turn_end,
        "\" does not occur in its rendering of an assistant turn"));
  }
  const size_t cut = end + turn_end.size();
  if (second->compare(0, cut, *first, 0, cut) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", tmpl.name(),
        ": appending messages changes how the earlier turns render, so a "
        "continuation cannot be appended to the cached tokens"));
  }
  return second->substr(cut);
}

absl::StatusOr<std::string> RenderOpening(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& observations,
    const nlohmann::ordered_json& tools, const nlohmann::ordered_json& extra,
    const std::map<std::string, std::string>& special_tokens) {
  if (!observations.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "observations must be a JSON array, got ", observations.type_name()));
  }
  ChatTemplateInputs before;
  before.messages =
      nlohmann::ordered_json::array({{{"role", "user"}, {"content", "U"}}});
  before.tools = tools;
  before.extra = extra;
  ChatTemplateInputs after = before;
  for (const auto& message : observations) after.messages.push_back(message);
  after.add_generation_prompt = true;
  absl::StatusOr<std::string> first =
      ApplyChatTemplate(tmpl, before, special_tokens);
  if (!first.ok()) return first.status();
  absl::StatusOr<std::string> second =
      ApplyChatTemplate(tmpl, after, special_tokens);
  if (!second.ok()) return second.status();
  if (second->compare(0, first->size(), *first) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", tmpl.name(),
        ": appending opening observations changes how the prompt renders, "
        "so they cannot be appended to the prompt's tokens"));
  }
  return second->substr(first->size());
}

}  // namespace tandem::chat
