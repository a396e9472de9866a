// tandem-chat-template: renders a chat template with our Jinja engine.
//
//   tandem-chat-template --template t.jinja --context ctx.json
//       renders t.jinja with the JSON object in ctx.json as its variables
//       and writes the text to stdout, byte for byte.
//   tandem-chat-template --tokenizer-dir DIR --inputs in.json [--name N]
//       loads DIR's chat template and special tokens and applies it to
//       {"messages": [...], "tools": [...]|null, "add_generation_prompt": b,
//        "extra": {...}} as transformers' apply_chat_template does.
//   tandem-chat-template --batch cases.jsonl
//       one JSON object per line: {"id", "template_file" | "tokenizer_dir",
//       "name"?, "context" | "inputs"}; writes one line per case:
//       {"id", "output"} or {"id", "error"}. Each template file is parsed
//       once per batch.
//
// Exit status: 0 rendered, 1 render or parse error (message on stderr),
// 2 usage error.

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/chat/chat_template.h"

namespace {

using tandem::chat::ChatTemplate;
using json = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<json> ReadJson(const std::string& path) {
  auto text = ReadAll(path);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(path + ": invalid JSON");
  return j;
}

absl::StatusOr<tandem::chat::ChatTemplateInputs> ParseInputs(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("inputs must be a JSON object");
  tandem::chat::ChatTemplateInputs inputs;
  if (j.contains("messages")) inputs.messages = j["messages"];
  if (j.contains("tools")) inputs.tools = j["tools"];
  if (j.contains("add_generation_prompt")) {
    if (!j["add_generation_prompt"].is_boolean()) {
      return absl::InvalidArgumentError("add_generation_prompt must be a boolean");
    }
    inputs.add_generation_prompt = j["add_generation_prompt"].get<bool>();
  }
  if (j.contains("extra")) inputs.extra = j["extra"];
  return inputs;
}

// Parsed templates by file and name, so a batch parses each template once.
using TemplateCache = std::map<std::pair<std::string, std::string>, ChatTemplate>;

// Renders one case described by `spec` (the batch line or the flags).
absl::StatusOr<std::string> RenderCase(const json& spec, TemplateCache* cache) {
  if (spec.contains("template_file")) {
    std::string path = spec["template_file"].get<std::string>();
    std::string name = spec.value("name", path);
    auto cached = cache->find({path, name});
    if (cached == cache->end()) {
      auto source = ReadAll(path);
      if (!source.ok()) return source.status();
      auto parsed = ChatTemplate::Parse(*source, name);
      if (!parsed.ok()) return parsed.status();
      cached = cache->emplace(std::make_pair(path, name), *std::move(parsed)).first;
    }
    const ChatTemplate* tmpl = &cached->second;
    if (spec.contains("inputs")) {
      auto inputs = ParseInputs(spec["inputs"]);
      if (!inputs.ok()) return inputs.status();
      std::map<std::string, std::string> tokens;
      if (spec.contains("special_tokens")) {
        for (const auto& [k, v] : spec["special_tokens"].items()) {
          if (v.is_string()) tokens[k] = v.get<std::string>();
        }
      }
      return tandem::chat::ApplyChatTemplate(*tmpl, *inputs, tokens);
    }
    return tmpl->Render(spec.value("context", json::object()));
  }
  if (spec.contains("tokenizer_dir")) {
    auto loaded = tandem::chat::LoadChatTemplates(spec["tokenizer_dir"].get<std::string>());
    if (!loaded.ok()) return loaded.status();
    auto tmpl = loaded->Get(spec.value("name", "default"));
    if (!tmpl.ok()) return tmpl.status();
    auto inputs = ParseInputs(spec.value("inputs", json::object()));
    if (!inputs.ok()) return inputs.status();
    return tandem::chat::ApplyChatTemplate(**tmpl, *inputs, loaded->special_tokens);
  }
  return absl::InvalidArgumentError("a case needs template_file or tokenizer_dir");
}

int RunBatch(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cannot open " << path << "\n";
    return 2;
  }
  std::string line;
  TemplateCache cache;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json spec = json::parse(line, nullptr, /*allow_exceptions=*/false);
    json out = json::object();
    if (spec.is_discarded() || !spec.is_object()) {
      out["error"] = "invalid JSON line";
    } else {
      out["id"] = spec.value("id", json());
      auto rendered = RenderCase(spec, &cache);
      if (rendered.ok()) {
        out["output"] = *rendered;
      } else {
        out["error"] = std::string(rendered.status().message());
      }
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Render a Hugging Face chat template with Tandem's Jinja engine"};
  std::string template_file, context_file, tokenizer_dir, inputs_file, batch_file, name;
  app.add_option("--template", template_file, "Jinja template file");
  app.add_option("--context", context_file, "JSON object of template variables");
  app.add_option("--tokenizer-dir", tokenizer_dir, "directory with tokenizer_config.json");
  app.add_option("--inputs", inputs_file, "apply_chat_template inputs as JSON");
  app.add_option("--name", name, "named template (list-form chat_template)");
  app.add_option("--batch", batch_file, "JSONL file of cases");
  CLI11_PARSE(app, argc, argv);
  if (!batch_file.empty()) return RunBatch(batch_file);
  json spec = json::object();
  if (!name.empty()) spec["name"] = name;
  if (!template_file.empty()) {
    spec["template_file"] = template_file;
    if (!context_file.empty()) {
      auto context = ReadJson(context_file);
      if (!context.ok()) {
        std::cerr << context.status().message() << "\n";
        return 2;
      }
      spec["context"] = *context;
    }
  } else if (!tokenizer_dir.empty()) {
    spec["tokenizer_dir"] = tokenizer_dir;
  } else {
    std::cerr << "give --template, --tokenizer-dir or --batch (see --help)\n";
    return 2;
  }
  if (!inputs_file.empty()) {
    auto inputs = ReadJson(inputs_file);
    if (!inputs.ok()) {
      std::cerr << inputs.status().message() << "\n";
      return 2;
    }
    spec["inputs"] = *inputs;
  }
  TemplateCache cache;
  auto rendered = RenderCase(spec, &cache);
  if (!rendered.ok()) {
    std::cerr << rendered.status().message() << "\n";
    return 1;
  }
  std::cout << *rendered;
  return 0;
}
