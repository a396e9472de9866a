#include "services/rollout/openai_choices.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace tandem::rollout::openai {
namespace {


template <typename T>
std::vector<T> From(const std::vector<T>& v, size_t start) {
  return std::vector<T>(v.begin() + static_cast<long>(start), v.end());
}

}  // namespace

const char* FinishReasonText(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    default:
      return "abort";
  }
}

ChoiceAssembler::ChoiceAssembler(const tokenizer::Tokenizer* tokenizer,
                                 int32_t n, std::vector<std::string> stop,
                                 std::optional<ToolParsing> tools)
    : tokenizer_(tokenizer),
      stop_(std::move(stop)),
      tools_(std::move(tools)),
      choices_(n) {
  for (const std::string& s : stop_) {
    max_stop_bytes_ = std::max(max_stop_bytes_, s.size());
  }
  for (int32_t i = 0; i < n; ++i) {
    choices_[i].result.index = i;
    if (tools_.has_value()) {
      choices_[i].calls.emplace(tools_->format,
                                absl::StrCat(tools_->id_prefix, i, "_"));
    }
  }
}

bool ChoiceAssembler::Absorb(int32_t index,
                             const std::vector<ServedToken>& tokens) {
  Choice& c = choices_[index];
  for (const ServedToken& t : tokens) {
    if (c.done) return false;
    c.result.token_ids.push_back(t.token);
    c.result.logprobs.push_back(t.logprob);
    c.result.policy_versions.push_back(t.policy_version);
    c.result.token_strings.push_back(
        tokenizer_->TokenString(t.token).value_or(std::string()));
    const size_t before = c.bytes.size();
    const bool special = tokenizer_->IsSpecial(t.token);
    if (!special) c.bytes += tokenizer_->TokenBytes(t.token);
    if (tools_.has_value()) {
      c.pieces.push_back({.bytes = tokenizer_->TokenBytes(t.token),
                          .special = special,
                          .visible_end = c.bytes.size()});
    }
    if (max_stop_bytes_ == 0) continue;
    // A new match ends in the new bytes, so starts at most
    // max_stop_bytes_ - 1 bytes before them.
    const size_t from =
        before >= max_stop_bytes_ ? before - max_stop_bytes_ + 1 : 0;
    size_t cut = std::string::npos;
    for (const std::string& s : stop_) {
      const size_t at = c.bytes.find(s, from);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      c.bytes.resize(cut);
      c.done = true;
      c.result.finish_reason = "stop";
      ParseCalls(c);
      return true;
    }
  }
  return false;
}

void ChoiceAssembler::Finish(int32_t index, engine::FinishReason reason) {
  Choice& c = choices_[index];
  if (c.done || reason == engine::FinishReason::kNone) return;
  c.done = true;
  c.result.finish_reason = FinishReasonText(reason);
  ParseCalls(c);
}

void ChoiceAssembler::FeedCalls(Choice& c, size_t limit, bool last) const {
  while (c.fed_pieces < c.pieces.size()) {
    // The next plain token, after any special ones.
    size_t plain = c.fed_pieces;
    while (plain < c.pieces.size() && c.pieces[plain].special) ++plain;
    if (plain == c.pieces.size()) return;  // trailing special tokens
    const Piece& p = c.pieces[plain];
    const size_t start = p.visible_end - p.bytes.size();
    if (start >= limit || (!last && p.visible_end > limit)) return;
    for (; c.fed_pieces < plain; ++c.fed_pieces) {
      c.calls->Append(c.pieces[c.fed_pieces].bytes);
    }
    // Only the last feed cuts a token: at the stop string.
    c.calls->Append(std::string_view(p.bytes).substr(
        0, std::min(p.bytes.size(), limit - start)));
    ++c.fed_pieces;
  }
}

void ChoiceAssembler::ParseCalls(Choice& c) const {
  if (!tools_.has_value()) return;
  // The text with special tokens (a format's markers may be special), up
  // to a stop string, less the special tokens that end it (the end of
  // turn, EOS).
  FeedCalls(c, c.bytes.size(), /*last=*/true);
  if (c.result.finish_reason != "stop") return;
  absl::StatusOr<chat::ParsedTurn> parsed = chat::ParseToolCalls(
      c.calls->text(), tools_->format,
      absl::StrCat(tools_->id_prefix, c.result.index, "_"));
  if (!parsed.ok() || parsed->calls.empty()) return;
  // The reader's calls agree with the parse but for the arguments' form:
  // the arguments then go out as the model wrote them, in a response as in
  // a stream.
  const std::vector<chat::ToolCallStream::Call> read = c.calls->calls();
  c.calls_agree = read.size() == parsed->calls.size();
  for (size_t i = 0; c.calls_agree && i < read.size(); ++i) {
    const std::string& mine = read[i].arguments;
    const std::string& theirs = parsed->calls[i].arguments_json;
    c.calls_agree =
        read[i].complete && read[i].name == parsed->calls[i].name &&
        (mine == theirs ||
         nlohmann::json::parse(mine, nullptr, false) ==
             nlohmann::json::parse(theirs, nullptr, false));
  }
  if (c.calls_agree) {
    for (size_t i = 0; i < read.size(); ++i) {
      parsed->calls[i].arguments_json = read[i].arguments;
    }
  }
  c.result.tool_calls = std::move(parsed->calls);
  c.bytes = std::move(parsed->content);
  c.result.finish_reason = "tool_calls";
}

bool ChoiceAssembler::all_done() const {
  return std::all_of(choices_.begin(), choices_.end(),
                     [](const Choice& c) { return c.done; });
}

int64_t ChoiceAssembler::completion_tokens() const {
  int64_t n = 0;
  for (const Choice& c : choices_) {
    n += static_cast<int64_t>(c.result.token_ids.size());
  }
  return n;
}

std::optional<ChoiceResult> ChoiceAssembler::TakeDelta(int32_t index,
                                                       bool* first) {
  Choice& c = choices_[index];
  if (tools_.has_value()) {
    ChoiceResult delta;
    TakeToolDelta(c, &delta);
    const bool new_tokens = c.result.token_ids.size() > c.sent_tokens;
    if (!new_tokens && delta.text.empty() && delta.tool_call_deltas.empty() &&
        delta.finish_reason.empty()) {
      return std::nullopt;
    }
    delta.index = c.result.index;
    delta.token_ids = From(c.result.token_ids, c.sent_tokens);
    delta.logprobs = From(c.result.logprobs, c.sent_tokens);
    delta.policy_versions = From(c.result.policy_versions, c.sent_tokens);
    delta.token_strings = From(c.result.token_strings, c.sent_tokens);
    *first = !c.sent_any;
    c.sent_any = true;
    c.sent_tokens = c.result.token_ids.size();
    return delta;
  }
  size_t safe = c.bytes.size();
  if (!c.done) {
    const size_t hold = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
    safe = safe > hold ? safe - hold : 0;
    safe = std::max(tokenizer::CompleteUtf8Length(absl::string_view(c.bytes).substr(
                        0, std::max(safe, c.sent_bytes))),
                    c.sent_bytes);
  }
  const bool new_tokens = c.result.token_ids.size() > c.sent_tokens;
  const bool finishing = c.done && !c.sent_final;
  if (!new_tokens && safe == c.sent_bytes && !finishing) return std::nullopt;
  ChoiceResult delta;
  delta.index = c.result.index;
  delta.text = tokenizer::ToValidUtf8(
      absl::string_view(c.bytes).substr(c.sent_bytes, safe - c.sent_bytes));
  delta.token_ids = From(c.result.token_ids, c.sent_tokens);
  delta.logprobs = From(c.result.logprobs, c.sent_tokens);
  delta.policy_versions = From(c.result.policy_versions, c.sent_tokens);
  delta.token_strings = From(c.result.token_strings, c.sent_tokens);
  if (c.done) {
    delta.finish_reason = c.result.finish_reason;
    c.sent_final = true;
  }
  *first = !c.sent_any;
  c.sent_any = true;
  c.sent_tokens = c.result.token_ids.size();
  c.sent_bytes = safe;
  return delta;
}

void ChoiceAssembler::TakeToolDelta(Choice& c, ChoiceResult* delta) {
  if (c.sent_final) return;
  if (!c.done) {
    // Text that a stop string may still cut stays with the reader's input.
    const size_t hold = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
    FeedCalls(c, c.bytes.size() > hold ? c.bytes.size() - hold : 0,
              /*last=*/false);
  }
  chat::ToolCallStream::Delta read = c.calls->Take();
  if (!c.done) {
    c.sent_content += read.content;
    delta->text = tokenizer::ToValidUtf8(read.content);
    delta->tool_call_deltas = std::move(read.calls);
    return;
  }
  // The last delta: the calls' last parts when the turn ends with them,
  // and the content the response has that the stream did not send (the
  // response's content begins with what was sent, but for leading
  // whitespace when the calls did not parse).
  if (c.calls_agree) delta->tool_call_deltas = std::move(read.calls);
  absl::string_view rest = c.bytes;
  if (!absl::ConsumePrefix(&rest, c.sent_content)) {
    absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(rest);
    if (absl::ConsumePrefix(&trimmed, c.sent_content)) rest = trimmed;
  }
  delta->text = tokenizer::ToValidUtf8(rest);
  delta->finish_reason = c.result.finish_reason;
  c.sent_final = true;
}

std::vector<ChoiceResult> ChoiceAssembler::Results() const {
  std::vector<ChoiceResult> out;
  for (const Choice& c : choices_) {
    out.push_back(c.result);
    out.back().text = tokenizer::ToValidUtf8(c.bytes);
  }
  return out;
}

}  // namespace tandem::rollout::openai
