#include "common/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_lexer.h"
#include "common/chat/jinja_parser.h"

namespace tandem::chat {

struct ChatTemplate::Parsed {
  std::string name;
  std::string source;
  NodeList nodes;
};

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source, std::string name) {
  auto parsed = std::make_shared<Parsed>();
  parsed->name = std::move(name);
  parsed->source = std::string(source);
  auto tokens = LexTemplate(parsed->source, parsed->name);
  if (!tokens.ok()) return tokens.status();
  auto nodes = ParseTemplate(*tokens, parsed->name);
  if (!nodes.ok()) return nodes.status();
  parsed->nodes = *std::move(nodes);
  return ChatTemplate(std::move(parsed));
}

absl::StatusOr<std::string> ChatTemplate::Render(const Value& context,
                                                 const RenderLimits& limits) const {
  return RenderTemplate(parsed_->nodes, context, parsed_->name, limits);
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const RenderLimits& limits) const {
  return Render(Value::FromJson(context), limits);
}

const std::string& ChatTemplate::name() const { return parsed_->name; }
const std::string& ChatTemplate::source() const { return parsed_->source; }

absl::StatusOr<const ChatTemplate*> LoadedChatTemplates::Get(std::string_view name) const {
  auto it = templates.find(std::string(name));
  if (it == templates.end()) {
    std::string known;
    for (const auto& [k, v] : templates) absl::StrAppend(&known, known.empty() ? "" : ", ", k);
    return absl::NotFoundError(absl::StrCat("no chat template named '", std::string(name), "' (have: ",
                                            known.empty() ? "none" : known, ")"));
  }
  return &it->second;
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json is a string or an AddedToken
// object {"content": "...", ...}.
std::optional<std::string> TokenString(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<LoadedChatTemplates> LoadChatTemplates(const std::string& tokenizer_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(tokenizer_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  LoadedChatTemplates loaded;
  std::vector<std::pair<std::string, std::string>> sources;  // name, source
  std::string origin = config_path.string();
  if (fs::exists(config_path)) {
    auto text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    nlohmann::ordered_json config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
    }
    static constexpr const char* kTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};
    for (const char* key : kTokens) {
      if (config.contains(key)) {
        if (auto s = TokenString(config[key])) loaded.special_tokens[key] = *s;
      }
    }
    if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
      // transformers passes the list itself; callers rarely need it, so it
      // stays out of the string map.
    }
    if (config.contains("chat_template")) {
      const nlohmann::ordered_json& ct = config["chat_template"];
      if (ct.is_string()) {
        sources.emplace_back("default", ct.get<std::string>());
      } else if (ct.is_array()) {
        for (size_t i = 0; i < ct.size(); ++i) {
          const nlohmann::ordered_json& item = ct[i];
          if (!item.is_object() || !item.contains("name") || !item["name"].is_string() ||
              !item.contains("template") || !item["template"].is_string()) {
            return absl::InvalidArgumentError(absl::StrCat(
                origin, ": chat_template[", i, "] must be {\"name\": str, \"template\": str}"));
          }
          sources.emplace_back(item["name"].get<std::string>(), item["template"].get<std::string>());
        }
      } else if (!ct.is_null()) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin, ": chat_template must be a string or a list, got ", ct.type_name()));
      }
    }
  }
  // Newer transformers save templates as files next to the config.
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    auto text = ReadFile(jinja);
    if (!text.ok()) return text.status();
    std::erase_if(sources, [](const auto& s) { return s.first == "default"; });
    sources.emplace_back("default", *text);
  }
  const fs::path extra_dir = dir / "additional_chat_templates";
  if (fs::is_directory(extra_dir)) {
    for (const auto& entry : fs::directory_iterator(extra_dir)) {
      if (entry.path().extension() != ".jinja") continue;
      auto text = ReadFile(entry.path());
      if (!text.ok()) return text.status();
      std::string name = entry.path().stem().string();
      std::erase_if(sources, [&](const auto& s) { return s.first == name; });
      sources.emplace_back(name, *text);
    }
  }
  if (sources.empty()) {
    return absl::NotFoundError(absl::StrCat("no chat template in ", tokenizer_dir,
                                            " (looked at tokenizer_config.json, chat_template.jinja, "
                                            "additional_chat_templates/)"));
  }
  for (auto& [name, source] : sources) {
    auto parsed = ChatTemplate::Parse(source, absl::StrCat(dir.filename().string(), "/", name));
    if (!parsed.ok()) return parsed.status();
    loaded.templates.insert_or_assign(name, *std::move(parsed));
  }
  return loaded;
}

absl::StatusOr<nlohmann::ordered_json> BuildChatTemplateContext(
    const ChatTemplateInputs& inputs, const std::map<std::string, std::string>& special_tokens) {
  if (!inputs.messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (!inputs.tools.is_null() && !inputs.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be a JSON array or null");
  }
  if (!inputs.extra.is_object()) return absl::InvalidArgumentError("extra must be a JSON object");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < inputs.messages.size(); ++i) {
    const nlohmann::ordered_json& m = inputs.messages[i];
    if (!m.is_object()) return absl::InvalidArgumentError(absl::StrCat("messages[", i, "] must be an object"));
    // transformers drops None-valued keys, then aliases the reasoning fields:
    // {"thinking": r, **message, "reasoning_content": r}.
    nlohmann::ordered_json reasoning;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      if (m.contains(key) && !m[key].is_null()) {
        reasoning = m[key];
        break;
      }
    }
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    bool has_thinking = m.contains("thinking") && !m["thinking"].is_null();
    if (!reasoning.is_null() && !has_thinking) out["thinking"] = reasoning;
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) out[key] = value;
    }
    if (!reasoning.is_null()) {
      out["reasoning_content"] = reasoning;
    }
    messages.push_back(std::move(out));
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (const auto& [k, v] : special_tokens) context[k] = v;
  context["messages"] = std::move(messages);
  context["tools"] = inputs.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = inputs.add_generation_prompt;
  for (const auto& [k, v] : inputs.extra.items()) context[k] = v;
  return context;
}

absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplate& tmpl, const ChatTemplateInputs& inputs,
                                              const std::map<std::string, std::string>& special_tokens,
                                              const RenderLimits& limits) {
  auto context = BuildChatTemplateContext(inputs, special_tokens);
  if (!context.ok()) return context.status();
  return tmpl.Render(*context, limits);
}

}  // namespace tandem::chat
