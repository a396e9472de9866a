// ChoiceAssembler (services/rollout/openai_choices.h) with tool calls: a
// stream sends a call piecewise as its tokens arrive (a header with the
// index, id and name, then fragments of the arguments), never the call's
// markup as content, and what a client accumulates from the deltas equals
// the non-streaming choice; every token is reported exactly once; a
// malformed call ends the stream as a response without calls.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/rollout/openai_choices.h"

namespace tandem::rollout::openai {
namespace {

using Json = nlohmann::json;

const std::vector<std::string> kSpecial = {"<|im_end|>", "<|python_tag|>",
                                           "<|eot_id|>", "<|eom_id|>"};
const std::vector<std::string> kAdded = {"<tool_call>", "</tool_call>"};

// A character-level tokenizer over printable ASCII (like the tests'
// episode model), with the two bytes of "é" as tokens of their own.
std::unique_ptr<tokenizer::Tokenizer> CharTokenizer() {
  Json vocab = Json::object();
  int id = 0;
  for (int c = 32; c < 127; ++c) vocab[std::string(1, char(c))] = id++;
  vocab["Ã"] = id++;  // byte 0xC3
  vocab["©"] = id++;  // byte 0xA9
  Json added = Json::array();
  auto add = [&](const std::string& content, bool special) {
    added.push_back({{"id", id++},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  };
  for (const std::string& t : kSpecial) add(t, true);
  for (const std::string& t : kAdded) add(t, false);
  Json json = {{"version", "1.0"},
               {"added_tokens", added},
               {"normalizer", nullptr},
               {"pre_tokenizer", nullptr},
               {"decoder",
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", false},
                 {"use_regex", false}}},
               {"model",
                {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"vocab", vocab},
                 {"merges", Json::array()}}}};
  auto tokenizer = tokenizer::Tokenizer::FromJson(json.dump(), "chars.json");
  INFO(tokenizer.status().ToString());
  REQUIRE(tokenizer.ok());
  return std::move(*tokenizer);
}

// One token per character; added tokens whole; "é" as its two bytes.
std::vector<int32_t> Tokens(const tokenizer::Tokenizer& tok,
                            const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (const auto* list : {&kSpecial, &kAdded}) {
      for (const std::string& t : *list) {
        if (!matched && text.compare(i, t.size(), t) == 0) {
          ids.push_back(*tok.TokenId(t));
          i += t.size();
          matched = true;
        }
      }
    }
    if (matched) continue;
    if (text.compare(i, 2, "\xC3\xA9") == 0) {
      ids.push_back(*tok.TokenId("Ã"));
      ids.push_back(*tok.TokenId("©"));
      i += 2;
      continue;
    }
    std::optional<int32_t> id = tok.TokenId(std::string(1, text[i]));
    REQUIRE(id.has_value());
    ids.push_back(*id);
    ++i;
  }
  return ids;
}

// What a client accumulates from a stream's deltas.
struct Accumulated {
  std::string content;
  std::vector<int32_t> token_ids;
  std::vector<uint64_t> versions;
  std::map<int32_t, std::string> ids, names, arguments;
  int fragments = 0;         // deltas with a non-empty arguments fragment
  bool header_first = true;  // every call's first delta had its name
  std::string finish_reason;
  std::vector<std::string> contents;  // each delta's content
  int deltas_after_header = 0;        // deltas that came after a header
};

struct Run {
  Accumulated stream;
  ChoiceResult whole;  // the same tokens, not streamed
};

ChoiceAssembler::ToolParsing Parsing(chat::ToolCallFormat format) {
  return {.format = format, .id_prefix = "call_9_"};
}

// Sends `text`'s tokens `per_step` at a time through a streaming assembler
// (taking a delta after each step) and at once through another one; the
// engine finishes them with `reason` unless a stop string did.
Run Generate(const std::string& text, chat::ToolCallFormat format,
             engine::FinishReason reason = engine::FinishReason::kStop,
             std::vector<std::string> stop = {}, size_t per_step = 1) {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = CharTokenizer();
  const std::vector<int32_t> ids = Tokens(*tok, text);
  ChoiceAssembler streamed(tok.get(), 1, stop, Parsing(format));
  ChoiceAssembler whole(tok.get(), 1, stop, Parsing(format));
  Run run;
  Accumulated& a = run.stream;
  bool header_seen = false;
  auto take = [&] {
    bool first = false;
    std::optional<ChoiceResult> d = streamed.TakeDelta(0, &first);
    if (!d.has_value()) return;
    a.contents.push_back(d->text);
    a.content += d->text;
    a.token_ids.insert(a.token_ids.end(), d->token_ids.begin(),
                       d->token_ids.end());
    a.versions.insert(a.versions.end(), d->policy_versions.begin(),
                      d->policy_versions.end());
    CHECK(d->tool_calls.empty());  // calls go out as parts only
    if (header_seen) ++a.deltas_after_header;
    for (const auto& call : d->tool_call_deltas) {
      if (!a.names.count(call.index) && !call.header) a.header_first = false;
      if (call.header) {
        header_seen = true;
        a.ids[call.index] = call.id;
        a.names[call.index] = call.name;
      }
      a.arguments[call.index] += call.arguments;
      if (!call.arguments.empty()) ++a.fragments;
    }
    if (!d->finish_reason.empty()) a.finish_reason = d->finish_reason;
  };
  bool stopped = false;
  for (size_t i = 0; i < ids.size() && !stopped; i += per_step) {
    std::vector<ServedToken> step;
    for (size_t j = i; j < std::min(ids.size(), i + per_step); ++j) {
      step.push_back({.token = ids[j],
                      .logprob = -0.5f,
                      .policy_version = static_cast<uint64_t>(j / 4)});
    }
    stopped = streamed.Absorb(0, step);
    take();
  }
  streamed.Finish(0, reason);
  take();
  CHECK(streamed.all_done());
  std::vector<ServedToken> all;
  for (size_t j = 0; j < ids.size(); ++j) {
    all.push_back({.token = ids[j],
                   .logprob = -0.5f,
                   .policy_version = static_cast<uint64_t>(j / 4)});
  }
  whole.Absorb(0, all);
  whole.Finish(0, reason);
  run.whole = whole.Results()[0];
  // Every token exactly once, with its version.
  CHECK(a.token_ids == run.whole.token_ids);
  CHECK(a.versions == run.whole.policy_versions);
  CHECK(a.finish_reason == run.whole.finish_reason);
  // A streaming assembler's own result is the non-streaming one.
  const ChoiceResult own = streamed.Results()[0];
  CHECK(own.text == run.whole.text);
  CHECK(own.tool_calls == run.whole.tool_calls);
  return run;
}

// The accumulated calls equal the response's.
void CheckCallsEqual(const Run& run) {
  const auto& calls = run.whole.tool_calls;
  REQUIRE(run.stream.names.size() == calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const int32_t k = static_cast<int32_t>(i);
    CHECK(run.stream.ids.at(k) == calls[i].id);
    CHECK(run.stream.names.at(k) == calls[i].name);
    CHECK(run.stream.arguments.at(k) == calls[i].arguments_json);
  }
  CHECK(run.stream.header_first);
}

bool HasMarkup(const std::string& s) {
  return s.find("tool_call") != std::string::npos ||
         s.find("python_tag") != std::string::npos ||
         s.find('<') != std::string::npos || s.find('{') != std::string::npos;
}

TEST_CASE("hermes: a call streams as a header then argument fragments") {
  const Run run = Generate(
      "Let me compute.  <tool_call> {\"name\": \"calculator\", "
      "\"arguments\": {\"expression\": \"12 * 7\"}} </tool_call><|im_end|>",
      chat::ToolCallFormat::kHermes);
  REQUIRE(run.whole.finish_reason == "tool_calls");
  REQUIRE(run.whole.tool_calls.size() == 1);
  CHECK(run.whole.tool_calls[0].id == "call_9_0_0");
  CHECK(run.whole.tool_calls[0].name == "calculator");
  // The model's text of the arguments, whitespace outside strings removed.
  CHECK(run.whole.tool_calls[0].arguments_json == R"({"expression":"12 * 7"})");
  CHECK(run.whole.text == "Let me compute.");
  CheckCallsEqual(run);
  CHECK(run.stream.content == run.whole.text);
  // Piecewise: one fragment per character of the arguments after the
  // header, and the header long before the end.
  CHECK(run.stream.fragments > 10);
  CHECK(run.stream.deltas_after_header > 10);
  for (const std::string& c : run.stream.contents) {
    INFO(c);
    CHECK_FALSE(HasMarkup(c));
  }
}

TEST_CASE("hermes: two calls, the model's key order, name after arguments") {
  const Run run = Generate(
      "<tool_call>{\"arguments\": {\"b\": 1, \"a\": [2, 3]}, \"name\": "
      "\"f\"}</tool_call> and <tool_call>{\"name\": \"g\"}</tool_call>",
      chat::ToolCallFormat::kHermes, engine::FinishReason::kStop, {}, 3);
  REQUIRE(run.whole.tool_calls.size() == 2);
  CHECK(run.whole.tool_calls[0].arguments_json == R"({"b":1,"a":[2,3]})");
  CHECK(run.whole.tool_calls[1].arguments_json == "{}");
  CHECK(run.whole.text == "and");
  CheckCallsEqual(run);
  CHECK(run.stream.content == "and");
}

TEST_CASE("hermes: arguments written as a JSON string arrive whole") {
  const Run run = Generate(
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}"
      "</tool_call>",
      chat::ToolCallFormat::kHermes);
  REQUIRE(run.whole.tool_calls.size() == 1);
  CHECK(run.whole.tool_calls[0].arguments_json == "{\"x\": 1}");
  CheckCallsEqual(run);
}

TEST_CASE("hermes: UTF-8 split across tokens never goes out in halves") {
  const Run run = Generate(
      "caf\xC3\xA9 <tool_call>{\"name\": \"f\", \"arguments\": {\"w\": "
      "\"caf\xC3\xA9\"}}</tool_call>",
      chat::ToolCallFormat::kHermes);
  REQUIRE(run.whole.tool_calls.size() == 1);
  CHECK(run.whole.tool_calls[0].arguments_json == "{\"w\":\"caf\xC3\xA9\"}");
  CheckCallsEqual(run);
  CHECK(run.stream.content == "caf\xC3\xA9");
}

TEST_CASE("llama3: <|python_tag|> calls and a turn that is one JSON call") {
  Run run = Generate(
      "Searching.<|python_tag|>{\"name\": \"search\", \"parameters\": "
      "{\"query\": \"weather {today}\"}}; {\"name\": \"calc\", "
      "\"parameters\": {\"e\": \"1+1\"}}<|eom_id|>",
      chat::ToolCallFormat::kLlama3);
  REQUIRE(run.whole.tool_calls.size() == 2);
  CHECK(run.whole.text == "Searching.");
  CheckCallsEqual(run);
  CHECK(run.stream.content == "Searching.");
  CHECK(run.stream.fragments > 4);

  run = Generate(
      " {\"name\": \"calc\", \"parameters\": {\"e\": \"2*3\"}}<|eot_id|>",
      chat::ToolCallFormat::kLlama3);
  REQUIRE(run.whole.tool_calls.size() == 1);
  CheckCallsEqual(run);
  CHECK(run.stream.content.empty());

  // A JSON answer without a name is content, in both.
  run = Generate("{\"answer\": 4}", chat::ToolCallFormat::kLlama3);
  CHECK(run.whole.tool_calls.empty());
  CHECK(run.whole.finish_reason == "stop");
  CHECK(run.stream.content == "{\"answer\": 4}");
  CHECK(run.stream.names.empty());
}

TEST_CASE("a malformed call ends the stream as a response without calls") {
  // Truncated JSON closed by </tool_call>: the text is the content.
  const std::string bad =
      "ok <tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1</tool_call>";
  Run run = Generate(bad, chat::ToolCallFormat::kHermes);
  CHECK(run.whole.tool_calls.empty());
  CHECK(run.whole.finish_reason == "stop");
  CHECK(run.whole.text == bad);
  CHECK(run.stream.content == bad);
  CHECK(run.stream.finish_reason == "stop");

  // The engine's max_tokens inside a call: "length", the text as content.
  const std::string cut = "<tool_call>{\"name\": \"f\", \"arguments\": {\"x";
  run = Generate(cut, chat::ToolCallFormat::kHermes,
                 engine::FinishReason::kLength);
  CHECK(run.whole.finish_reason == "length");
  CHECK(run.whole.tool_calls.empty());
  CHECK(run.stream.content == cut);
  CHECK(run.stream.finish_reason == "length");
  // Its header went out while it was being written (not taken back).
  CHECK(run.stream.names.at(0) == "f");
}

TEST_CASE("a stop string after a call: the text before it is parsed") {
  const Run run = Generate(
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>"
      "STOP and more",
      chat::ToolCallFormat::kHermes, engine::FinishReason::kStop, {"STOP"});
  CHECK(run.whole.finish_reason == "tool_calls");
  REQUIRE(run.whole.tool_calls.size() == 1);
  CheckCallsEqual(run);
  CHECK(run.stream.content.empty());
}

TEST_CASE("without calls, text streams with tools as without them") {
  const Run run =
      Generate("The answer is 84.<|im_end|>", chat::ToolCallFormat::kHermes);
  CHECK(run.whole.finish_reason == "stop");
  CHECK(run.whole.text == "The answer is 84.");
  CHECK(run.stream.content == "The answer is 84.");
  // It streamed: more than one delta carried text.
  int with_text = 0;
  for (const std::string& c : run.stream.contents) with_text += !c.empty();
  CHECK(with_text > 5);
}

}  // namespace
}  // namespace tandem::rollout::openai
