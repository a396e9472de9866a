#include "common/chat/tool_calls.h"

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {
namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

using Json = nlohmann::json;

// Debian's Abseil has its own string_view: these helpers work on the
// standard one.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }
bool IsSpace(char c) {
  return absl::ascii_isspace(static_cast<unsigned char>(c));
}
std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  return s;
}
std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}
std::string_view Trim(std::string_view s) { return TrimRight(TrimLeft(s)); }
bool ConsumeSuffix(std::string_view* s, std::string_view suffix) {
  if (s->size() < suffix.size() ||
      s->substr(s->size() - suffix.size()) != suffix) {
    return false;
  }
  s->remove_suffix(suffix.size());
  return true;
}

// Parses `text` as JSON without letting an exception leave this file.
absl::StatusOr<Json> ParseJson(std::string_view text, size_t offset,
                               int32_t index) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tool call ", index, " at byte ", offset, ": not valid JSON (",
        e.what(), "): ", AV(text.substr(0, 200))));
  }
}

// Turns one parsed call object into a ParsedToolCall. `args_keys` are the
// keys that may hold the arguments, in preference order.
absl::StatusOr<ParsedToolCall> CallFromJson(
    const Json& call, size_t offset, int32_t index, std::string_view id_prefix,
    std::initializer_list<const char*> args_keys) {
  const std::string where =
      absl::StrCat("tool call ", index, " at byte ", offset);
  if (!call.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected a JSON object, got ", call.type_name()));
  }
  auto name = call.find("name");
  if (name == call.end() || !name->is_string() ||
      name->get_ref<const std::string&>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"name\" must be a non-empty string, got ",
                     name == call.end() ? "nothing" : name->dump()));
  }
  ParsedToolCall out;
  out.id = absl::StrCat(AV(id_prefix), index);
  out.name = name->get<std::string>();
  out.arguments_json = "{}";
  for (const char* key : args_keys) {
    auto args = call.find(key);
    if (args == call.end() || args->is_null()) continue;
    if (args->is_object()) {
      out.arguments_json = args->dump();
    } else if (args->is_string()) {
      out.arguments_json = args->get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\" must be a JSON object, got ",
                       args->type_name(), " ", args->dump()));
    }
    break;
  }
  return out;
}

// The end (one past the closing brace) of the JSON object that starts at
// text[begin] == '{', honouring strings and escapes; npos when unbalanced.
size_t ObjectEnd(std::string_view text, size_t begin) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

absl::Status CheckCount(const ParsedTurn& turn, const ToolCallLimits& limits) {
  if (static_cast<int32_t>(turn.calls.size()) >= limits.max_calls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "more than ", limits.max_calls, " tool calls in one turn"));
  }
  return absl::OkStatus();
}

// Drops the end-of-turn special tokens a decoded turn may end with.
std::string_view StripEndOfTurn(std::string_view turn) {
  std::string_view text = TrimRight(turn);
  bool stripped = true;
  while (stripped) {
    stripped = false;
    for (std::string_view end_token :
         {"<|im_end|>", "<|endoftext|>", "<|eom_id|>", "<|eot_id|>"}) {
      if (ConsumeSuffix(&text, end_token)) {
        text = TrimRight(text);
        stripped = true;
      }
    }
  }
  return text;
}

absl::StatusOr<ParsedTurn> ParseHermes(std::string_view turn,
                                       std::string_view id_prefix,
                                       const ToolCallLimits& limits) {
  turn = StripEndOfTurn(turn);
  ParsedTurn out;
  std::string content;
  size_t pos = 0;
  while (true) {
    const size_t open = turn.find(kHermesOpen, pos);
    if (open == std::string_view::npos) {
      content.append(turn.substr(pos));
      break;
    }
    content.append(turn.substr(pos, open - pos));
    const int32_t index = static_cast<int32_t>(out.calls.size());
    const size_t body = open + kHermesOpen.size();
    const size_t close = turn.find(kHermesClose, body);
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool call ", index, ": <tool_call> at byte ", open,
                       " is never closed by </tool_call>"));
    }
    if (absl::Status s = CheckCount(out, limits); !s.ok()) return s;
    std::string_view text = turn.substr(body, close - body);
    const size_t lead = text.size() - TrimLeft(text).size();
    text = Trim(text);
    absl::StatusOr<Json> json = ParseJson(text, body + lead, index);
    if (!json.ok()) return json.status();
    absl::StatusOr<ParsedToolCall> call = CallFromJson(
        *json, body + lead, index, id_prefix, {"arguments", "parameters"});
    if (!call.ok()) return call.status();
    out.calls.push_back(*std::move(call));
    pos = close + kHermesClose.size();
  }
  out.content = std::string(Trim(content));
  return out;
}

// One or more JSON call objects separated by ';' or whitespace, starting at
// text[begin].
absl::Status ParseLlamaCalls(std::string_view text, size_t begin,
                             std::string_view id_prefix,
                             const ToolCallLimits& limits, ParsedTurn* out) {
  size_t pos = begin;
  while (true) {
    while (pos < text.size() && (IsSpace(text[pos]) || text[pos] == ';')) {
      ++pos;
    }
    if (pos >= text.size()) break;
    const int32_t index = static_cast<int32_t>(out->calls.size());
    if (text[pos] != '{') {
      return absl::InvalidArgumentError(absl::StrCat(
          "tool call ", index, " at byte ", pos,
          ": expected a JSON object, got: ", AV(text.substr(pos, 80))));
    }
    const size_t end = ObjectEnd(text, pos);
    if (end == std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tool call ", index, " at byte ", pos,
          ": the JSON object is never closed: ", AV(text.substr(pos, 200))));
    }
    if (absl::Status s = CheckCount(*out, limits); !s.ok()) return s;
    absl::StatusOr<Json> json =
        ParseJson(text.substr(pos, end - pos), pos, index);
    if (!json.ok()) return json.status();
    absl::StatusOr<ParsedToolCall> call =
        CallFromJson(*json, pos, index, id_prefix, {"parameters", "arguments"});
    if (!call.ok()) return call.status();
    out->calls.push_back(*std::move(call));
    pos = end;
  }
  if (out->calls.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no tool call after <|python_tag|> at byte ",
                     begin - kPythonTag.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParsedTurn> ParseLlama3(std::string_view turn,
                                       std::string_view id_prefix,
                                       const ToolCallLimits& limits) {
  const std::string_view text = StripEndOfTurn(turn);
  ParsedTurn out;
  const size_t tag = text.find(kPythonTag);
  if (tag != std::string_view::npos) {
    out.content = std::string(Trim(text.substr(0, tag)));
    if (absl::Status s = ParseLlamaCalls(text, tag + kPythonTag.size(),
                                         id_prefix, limits, &out);
        !s.ok()) {
      return s;
    }
    return out;
  }
  const std::string_view trimmed = Trim(text);
  const size_t lead = text.size() - TrimLeft(text).size();
  // A turn that is one JSON object naming a function is a call; any other
  // text (a JSON answer without "name" included) is the model's answer.
  if (!trimmed.empty() && trimmed.front() == '{' && trimmed.back() == '}' &&
      trimmed.find("\"name\"") != std::string_view::npos) {
    if (absl::Status s = ParseLlamaCalls(text, lead, id_prefix, limits, &out);
        !s.ok()) {
      return s;
    }
    return out;
  }
  out.content = std::string(trimmed);
  return out;
}

}  // namespace

absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name) {
  if (name == "hermes" || name == "qwen" || name == "demo") {
    return ToolCallFormat::kHermes;
  }
  if (name == "llama3") return ToolCallFormat::kLlama3;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool call format \"", AV(name),
                   "\" (expected hermes, qwen, demo or llama3)"));
}

const char* ToolCallFormatName(ToolCallFormat format) {
  return format == ToolCallFormat::kLlama3 ? "llama3" : "hermes";
}

absl::StatusOr<ParsedTurn> ParseToolCalls(std::string_view turn,
                                          ToolCallFormat format,
                                          std::string_view id_prefix,
                                          const ToolCallLimits& limits) {
  switch (format) {
    case ToolCallFormat::kLlama3:
      return ParseLlama3(turn, id_prefix, limits);
    case ToolCallFormat::kHermes:
    default:
      return ParseHermes(turn, id_prefix, limits);
  }
}

}  // namespace tandem::chat
