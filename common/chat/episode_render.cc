#include "common/chat/episode_render.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::chat {
namespace {

// A template's rendering of `messages` (before) and of `messages` followed
// by `observations` with the generation header (after): the text the
// observations add is what `after` has past `before`'s common prefix.
struct Renderings {
  std::string before;
  std::string after;
};

absl::StatusOr<Renderings> RenderWithAndWithout(
    const ChatTemplate& tmpl, nlohmann::ordered_json messages,
    const nlohmann::ordered_json& observations,
    const nlohmann::ordered_json& tools, const nlohmann::ordered_json& extra,
    const std::map<std::string, std::string>& special_tokens) {
  if (!observations.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "observations must be a JSON array, got ", observations.type_name()));
  }
  ChatTemplateInputs before;
  before.messages = std::move(messages);
  before.tools = tools;
  before.extra = extra;
  ChatTemplateInputs after = before;
  for (const auto& message : observations) after.messages.push_back(message);
  after.add_generation_prompt = true;
  Renderings out;
  ASSIGN_OR_RETURN(out.before, ApplyChatTemplate(tmpl, before, special_tokens));
  ASSIGN_OR_RETURN(out.after, ApplyChatTemplate(tmpl, after, special_tokens));
  return out;
}

}  // namespace

absl::StatusOr<std::string> RenderContinuation(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& observations,
    const std::string& turn_end, const nlohmann::ordered_json& tools,
    const nlohmann::ordered_json& extra,
    const std::map<std::string, std::string>& special_tokens) {
  ASSIGN_OR_RETURN(
      const Renderings r,
      RenderWithAndWithout(tmpl,
                           nlohmann::ordered_json::array(
                               {{{"role", "user"}, {"content", "U"}},
                                {{"role", "assistant"}, {"content", "A"}}}),
                           observations, tools, extra, special_tokens));
  const size_t end =
      turn_end.empty() ? std::string::npos : r.before.rfind(turn_end);
  if (end == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", tmpl.name(), ": the end-of-turn text \"", turn_end,
        "\" does not occur in its rendering of an assistant turn"));
  }
  const size_t cut = end + turn_end.size();
  if (r.after.compare(0, cut, r.before, 0, cut) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", tmpl.name(),
        ": appending messages changes how the earlier turns render, so a "
        "continuation cannot be appended to the cached tokens"));
  }
  return r.after.substr(cut);
}

absl::StatusOr<std::string> RenderOpening(
    const ChatTemplate& tmpl, const nlohmann::ordered_json& observations,
    const nlohmann::ordered_json& tools, const nlohmann::ordered_json& extra,
    const std::map<std::string, std::string>& special_tokens) {
  ASSIGN_OR_RETURN(
      const Renderings r,
      RenderWithAndWithout(tmpl,
                           nlohmann::ordered_json::array(
                               {{{"role", "user"}, {"content", "U"}}}),
                           observations, tools, extra, special_tokens));
  if (r.after.compare(0, r.before.size(), r.before) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", tmpl.name(),
        ": appending opening observations changes how the prompt renders, "
        "so they cannot be appended to the prompt's tokens"));
  }
  return r.after.substr(r.before.size());
}

}  // namespace tandem::chat
