// Unit tests of tool-call parsing (common/chat/tool_calls.h) on turns
// written the way each family writes them: Qwen2.5/Qwen3/Hermes
// <tool_call> blocks (also the built-in demo model's format), Llama 3.1
// JSON turns with and without <|python_tag|>, and malformed calls, which
// must come back as errors that name the call and the byte.

#include <catch2/catch.hpp>
#include <string>

#include "common/chat/tool_calls.h"

namespace tandem::chat {
namespace {

ParsedTurn MustParse(const std::string& turn, ToolCallFormat format) {
  absl::StatusOr<ParsedTurn> parsed = ParseToolCalls(turn, format);
  INFO(turn);
  REQUIRE(parsed.ok());
  return *parsed;
}

std::string MustFail(const std::string& turn, ToolCallFormat format,
                     const ToolCallLimits& limits = {}) {
  absl::StatusOr<ParsedTurn> parsed =
      ParseToolCalls(turn, format, "call_", limits);
  INFO(turn);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST_CASE("hermes: Qwen2.5's two parallel calls with text before them") {
  const std::string turn =
      "Let me check both.\n<tool_call>\n{\"name\": "
      "\"get_current_temperature\", "
      "\"arguments\": {\"location\": \"San Francisco, CA, "
      "USA\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": "
      "{\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}}\n"
      "</tool_call><|im_end|>";
  ParsedTurn parsed = MustParse(turn, ToolCallFormat::kHermes);
  CHECK(parsed.content == "Let me check both.");
  REQUIRE(parsed.calls.size() == 2);
  CHECK(parsed.calls[0] ==
        ParsedToolCall{"call_0", "get_current_temperature",
                       R"({"location":"San Francisco, CA, USA"})"});
  CHECK(parsed.calls[1] ==
        ParsedToolCall{
            "call_1", "get_temperature_date",
            R"({"date":"2024-10-01","location":"San Francisco, CA, USA"})"});
}

TEST_CASE(
    "hermes: the demo model's calculator call, and a turn without calls") {
  ParsedTurn call = MustParse(
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": "
      "\"317*29\"}}</tool_call>",
      ToolCallFormat::kHermes);
  CHECK(call.content.empty());
  REQUIRE(call.calls.size() == 1);
  CHECK(call.calls[0].name == "calculator");
  CHECK(call.calls[0].arguments_json == R"({"expression":"317*29"})");

  ParsedTurn answer =
      MustParse("The answer is 9193.<|im_end|>", ToolCallFormat::kHermes);
  CHECK(answer.content == "The answer is 9193.");
  CHECK(answer.calls.empty());
}

TEST_CASE("hermes: Qwen3 thinking before a call keeps the text outside it") {
  ParsedTurn parsed = MustParse(
      "<think>\nI need the calculator.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"calculator\", \"arguments\": {\"expression\": \"2+2\"}}\n</tool_call>"
      "\nafter",
      ToolCallFormat::kHermes);
  CHECK(parsed.content ==
        "<think>\nI need the calculator.\n</think>\n\n\nafter");
  REQUIRE(parsed.calls.size() == 1);
}

TEST_CASE("hermes: arguments missing, null, or written as a JSON string") {
  auto none = MustParse("<tool_call>{\"name\": \"now\"}</tool_call>",
                        ToolCallFormat::kHermes);
  CHECK(none.calls.at(0).arguments_json == "{}");
  auto null_args = MustParse(
      "<tool_call>{\"name\": \"now\", \"arguments\": null}</tool_call>",
      ToolCallFormat::kHermes);
  CHECK(null_args.calls.at(0).arguments_json == "{}");
  auto stringified = MustParse(
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}"
      "</tool_call>",
      ToolCallFormat::kHermes);
  CHECK(stringified.calls.at(0).arguments_json == "{\"x\": 1}");
}

TEST_CASE("hermes: malformed calls are errors naming the call and the byte") {
  // Truncated JSON (the model ran out of tokens inside the call).
  std::string msg = MustFail(
      "ok <tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expr"
      "</tool_call>",
      ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("tool call 0 at byte 15: not valid JSON"));
  // Never closed.
  msg = MustFail("<tool_call>{\"name\": \"f\"}", ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("<tool_call> at byte 0 is never closed"));
  // The second call is the bad one.
  msg = MustFail(
      "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"arguments\": {}}"
      "</tool_call>",
      ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("tool call 1 at byte 47"));
  CHECK_THAT(msg, Catch::Contains("\"name\" must be a non-empty string"));
  msg =
      MustFail("<tool_call>{\"name\": 7}</tool_call>", ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("got 7"));
  msg = MustFail("<tool_call>[1, 2]</tool_call>", ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("expected a JSON object, got array"));
  msg = MustFail("<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                 ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("\"arguments\" must be a JSON object"));
  msg = MustFail("<tool_call></tool_call>", ToolCallFormat::kHermes);
  CHECK_THAT(msg, Catch::Contains("not valid JSON"));
}

TEST_CASE("hermes: more calls than the limit are refused") {
  std::string turn;
  for (int i = 0; i < 4; ++i)
    turn += "<tool_call>{\"name\": \"f\"}</tool_call>";
  ToolCallLimits limits;
  limits.max_calls = 3;
  CHECK_THAT(MustFail(turn, ToolCallFormat::kHermes, limits),
             Catch::Contains("more than 3 tool calls"));
  limits.max_calls = 4;
  CHECK(ParseToolCalls(turn, ToolCallFormat::kHermes, "c", limits)
            ->calls.size() == 4);
}

TEST_CASE("llama3: a JSON turn is a call; parameters become the arguments") {
  ParsedTurn parsed = MustParse(
      "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": "
      "\"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}<|eot_id|>",
      ToolCallFormat::kLlama3);
  CHECK(parsed.content.empty());
  REQUIRE(parsed.calls.size() == 1);
  CHECK(parsed.calls[0] ==
        ParsedToolCall{
            "call_0", "get_current_conditions",
            R"({"location":"San Francisco, CA","unit":"Fahrenheit"})"});
}

TEST_CASE("llama3: <|python_tag|> with text before it and two calls") {
  ParsedTurn parsed = MustParse(
      "Searching.<|python_tag|>{\"name\": \"brave_search\", \"parameters\": "
      "{\"query\": \"weather {today}\"}}; {\"name\": \"calculator\", "
      "\"parameters\": {\"expression\": \"1+1\"}}<|eom_id|>",
      ToolCallFormat::kLlama3);
  CHECK(parsed.content == "Searching.");
  REQUIRE(parsed.calls.size() == 2);
  CHECK(parsed.calls[0].arguments_json == R"({"query":"weather {today}"})");
  CHECK(parsed.calls[1].id == "call_1");
  CHECK(parsed.calls[1].name == "calculator");
}

TEST_CASE("llama3: plain answers, JSON answers without a name, and errors") {
  CHECK(MustParse("The answer is 4.<|eot_id|>", ToolCallFormat::kLlama3)
            .content == "The answer is 4.");
  ParsedTurn json_answer =
      MustParse("{\"answer\": 4}", ToolCallFormat::kLlama3);
  CHECK(json_answer.calls.empty());
  CHECK(json_answer.content == "{\"answer\": 4}");

  CHECK_THAT(MustFail("{\"name\": \"f\", \"parameters\": {\"a\": }}",
                      ToolCallFormat::kLlama3),
             Catch::Contains("tool call 0 at byte 0: not valid JSON"));
  CHECK_THAT(MustFail("<|python_tag|>print(1)", ToolCallFormat::kLlama3),
             Catch::Contains("expected a JSON object, got: print(1)"));
  CHECK_THAT(MustFail("<|python_tag|>{\"name\": \"f\", \"parameters\": {",
                      ToolCallFormat::kLlama3),
             Catch::Contains("never closed"));
  CHECK_THAT(MustFail("<|python_tag|>  <|eom_id|>", ToolCallFormat::kLlama3),
             Catch::Contains("no tool call after <|python_tag|> at byte 0"));
}

TEST_CASE("format names") {
  CHECK(*ToolCallFormatFromName("qwen") == ToolCallFormat::kHermes);
  CHECK(*ToolCallFormatFromName("demo") == ToolCallFormat::kHermes);
  CHECK(*ToolCallFormatFromName("llama3") == ToolCallFormat::kLlama3);
  absl::StatusOr<ToolCallFormat> bad = ToolCallFormatFromName("mistral");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("unknown tool call format \"mistral\""));
}

}  // namespace
}  // namespace tandem::chat
