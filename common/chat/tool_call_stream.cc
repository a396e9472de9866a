#include "common/chat/tool_call_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {
namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsSpace(char c) {
  return absl::ascii_isspace(static_cast<unsigned char>(c));
}


// The length of the longest suffix of `text` that is a proper prefix of
// `marker` (the marker may be completed by the next bytes).
size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// A JSON string literal's contents; false when it is not one.
bool Unescape(const std::string& literal, std::string* out) {
  nlohmann::json value =
      nlohmann::json::parse(literal, nullptr, /*allow_exceptions=*/false);
  if (!value.is_string()) return false;
  *out = value.get<std::string>();
  return true;
}

}  // namespace

ToolCallStream::ToolCallStream(ToolCallFormat format, std::string id_prefix)
    : format_(format),
      id_prefix_(std::move(id_prefix)),
      marker_(format == ToolCallFormat::kLlama3 ? kPythonTag : kHermesOpen),
      preferred_(format == ToolCallFormat::kLlama3 ? "parameters"
                                                   : "arguments"),
      fallback_(format == ToolCallFormat::kLlama3 ? "arguments"
                                                  : "parameters") {}

void ToolCallStream::Append(std::string_view text) {
  text_.append(text);
  Scan();
}

void ToolCallStream::Scan() {
  while (pos_ < text_.size()) {
    switch (mode_) {
      case Mode::kText:
        if (!ScanText()) return;
        break;
      case Mode::kBeforeBody:
      case Mode::kCallList: {
        const char c = text_[pos_];
        if (IsSpace(c) || (mode_ == Mode::kCallList && c == ';')) {
          ++pos_;
        } else if (c == '{') {
          ++pos_;
          BeginObject();
        } else {
          mode_ = Mode::kBroken;
        }
        break;
      }
      case Mode::kObject:
        ScanObjectChar(text_[pos_++]);
        break;
      case Mode::kAfterBody: {
        if (IsSpace(text_[pos_])) {
          ++pos_;
          break;
        }
        const std::string_view rest = std::string_view(text_).substr(pos_);
        if (rest.size() < kHermesClose.size()) {
          if (kHermesClose.substr(0, rest.size()) != rest) {
            mode_ = Mode::kBroken;
          }
          return;  // wait for the rest of </tool_call>
        }
        if (rest.substr(0, kHermesClose.size()) != kHermesClose) {
          mode_ = Mode::kBroken;
          break;
        }
        pos_ += kHermesClose.size();
        mode_ = Mode::kText;
        break;
      }
      case Mode::kBroken:
        return;
    }
  }
}

bool ToolCallStream::ScanText() {
  // Llama 3's other form: a turn that is a JSON object is a call.
  if (format_ == ToolCallFormat::kLlama3 && !content_started_ &&
      states_.empty()) {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
    if (pos_ == text_.size()) return false;
    if (text_[pos_] == '{') {
      ++pos_;
      BeginObject();
      return true;
    }
  }
  const std::string_view rest = std::string_view(text_).substr(pos_);
  const size_t at = rest.find(marker_);
  if (at != std::string_view::npos) {
    AddContent(rest.substr(0, at));
    pos_ += at + marker_.size();
    mode_ = format_ == ToolCallFormat::kLlama3 ? Mode::kCallList
                                               : Mode::kBeforeBody;
    return true;
  }
  const size_t ready = rest.size() - PartialMarker(rest, marker_);
  AddContent(rest.substr(0, ready));
  pos_ += ready;
  return false;
}

void ToolCallStream::AddContent(std::string_view text) {
  for (const char c : text) {
    if (IsSpace(c)) {
      if (content_started_) pending_space_.push_back(c);
      continue;
    }
    content_ += pending_space_;
    pending_space_.clear();
    content_.push_back(c);
    content_started_ = true;
  }
}

void ToolCallStream::BeginObject() {
  CallState state;
  state.call.id = absl::StrCat(id_prefix_, states_.size());
  states_.push_back(std::move(state));
  mode_ = Mode::kObject;
  depth_ = 1;
  in_string_ = false;
  escaped_ = false;
  member_ = Member::kExpectKey;
}

void ToolCallStream::Record(char c) {
  if (member_ == Member::kKey) {
    key_raw_.push_back(c);
    return;
  }
  if (member_ != Member::kValue) return;
  value_raw_.push_back(c);
  CallState& s = states_.back();
  if (s.live_arguments) s.call.arguments.push_back(c);
}

void ToolCallStream::ScanObjectChar(char c) {
  if (in_string_) {
    Record(c);
    if (escaped_) {
      escaped_ = false;
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (depth_ == 1 && member_ == Member::kKey) {
        if (!Unescape(key_raw_, &key_)) key_.clear();
        member_ = Member::kExpectColon;
      } else if (depth_ == 1 && member_ == Member::kValue) {
        EndValue();
      }
    }
    return;
  }
  // Whitespace outside strings is dropped: the arguments go out minified.
  if (IsSpace(c)) return;
  if (depth_ == 1 && member_ != Member::kValue) {
    switch (member_) {
      case Member::kExpectKey:
        if (c == '"') {
          member_ = Member::kKey;
          key_raw_ = "\"";
          in_string_ = true;
        } else if (c == '}') {
          EndObject();
        } else if (c != ',') {
          mode_ = Mode::kBroken;
        }
        return;
      case Member::kExpectColon:
        if (c == ':') {
          member_ = Member::kExpectValue;
        } else {
          mode_ = Mode::kBroken;
        }
        return;
      default:  // kExpectValue
        BeginValue(c);
        return;
    }
  }
  // Inside a value.
  if (depth_ == 1) {  // a literal: true, false, null or a number
    if (c == ',' || c == '}') {
      EndValue();
      if (c == '}') EndObject();
      return;
    }
    Record(c);
    return;
  }
  Record(c);
  if (c == '"') {
    in_string_ = true;
  } else if (c == '{' || c == '[') {
    ++depth_;
  } else if (c == '}' || c == ']') {
    if (--depth_ == 1) EndValue();
  }
}

void ToolCallStream::BeginValue(char c) {
  CallState& s = states_.back();
  member_ = Member::kValue;
  value_kind_ = c;
  value_raw_.clear();
  if (key_ == preferred_ && c == '{' && s.preferred_raw.empty() &&
      !s.streams_arguments) {
    s.live_arguments = true;
    s.streams_arguments = true;
  }
  Record(c);
  if (c == '"') {
    in_string_ = true;
    escaped_ = false;
  } else if (c == '{' || c == '[') {
    ++depth_;
  }
}

void ToolCallStream::EndValue() {
  CallState& s = states_.back();
  s.live_arguments = false;
  if (key_ == "name") {
    std::string name;
    if (s.call.name.empty() && Unescape(value_raw_, &name)) {
      s.call.name = std::move(name);
    }
  } else if (key_ == preferred_) {
    if (s.preferred_raw.empty()) s.preferred_raw = value_raw_;
  } else if (key_ == fallback_) {
    if (s.fallback_raw.empty()) s.fallback_raw = value_raw_;
  }
  member_ = Member::kExpectKey;
}

void ToolCallStream::EndObject() {
  CallState& s = states_.back();
  depth_ = 0;
  if (s.call.name.empty()) {
    mode_ = Mode::kBroken;
    return;
  }
  // The arguments as ParseToolCalls picks them: the first key in
  // preference order that is present and not null.
  std::string arguments = "{}";
  for (const std::string* raw : {&s.preferred_raw, &s.fallback_raw}) {
    if (raw->empty() || *raw == "null") continue;
    if ((*raw)[0] == '{') {
      arguments = *raw;
    } else if ((*raw)[0] != '"' || !Unescape(*raw, &arguments)) {
      mode_ = Mode::kBroken;
      return;
    }
    break;
  }
  if (s.sent_arguments > arguments.size() ||
      arguments.compare(0, s.sent_arguments, s.call.arguments, 0,
                        s.sent_arguments) != 0) {
    mode_ = Mode::kBroken;  // cannot happen: what was sent stays a prefix
    return;
  }
  s.call.arguments = std::move(arguments);
  s.call.complete = true;
  mode_ =
      format_ == ToolCallFormat::kLlama3 ? Mode::kCallList : Mode::kAfterBody;
}

ToolCallStream::Delta ToolCallStream::Take() {
  Delta delta;
  const size_t ready = tokenizer::CompleteUtf8Length(content_);
  if (ready > sent_content_) {
    delta.content = content_.substr(sent_content_, ready - sent_content_);
    sent_content_ = ready;
  }
  for (size_t i = 0; i < states_.size(); ++i) {
    CallState& s = states_[i];
    // A call without a name yet holds back every later one too (indexes
    // are sent in order).
    if (s.call.name.empty()) break;
    const std::string& args = s.call.arguments;
    size_t end = s.sent_arguments;
    if (s.call.complete) {
      end = args.size();
    } else if (s.streams_arguments) {
      end = std::max(tokenizer::CompleteUtf8Length(args), s.sent_arguments);
    }
    if (s.header_sent && end == s.sent_arguments) continue;
    CallDelta d;
    d.index = static_cast<int32_t>(i);
    if (!s.header_sent) {
      d.header = true;
      d.id = s.call.id;
      d.name = s.call.name;
      s.header_sent = true;
    }
    d.arguments = args.substr(s.sent_arguments, end - s.sent_arguments);
    s.sent_arguments = end;
    delta.calls.push_back(std::move(d));
  }
  return delta;
}

std::vector<ToolCallStream::Call> ToolCallStream::calls() const {
  std::vector<Call> out;
  out.reserve(states_.size());
  for (const CallState& s : states_) out.push_back(s.call);
  return out;
}

}  // namespace tandem::chat
