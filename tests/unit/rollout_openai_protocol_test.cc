#include <catch2/catch.hpp>
#include <string>

#include "services/rollout/openai_protocol.h"

namespace tandem::rollout::openai {
namespace {

// Parses `body` for /v1/completions (or chat); returns the error.
ApiError Refused(std::string_view body,
                 Endpoint endpoint = Endpoint::kCompletions) {
  ApiError error;
  auto parsed = ParseCompletionRequest(endpoint, body, RequestLimits{}, &error);
  CHECK_FALSE(parsed.has_value());
  CHECK(error.http_status == 400);
  return error;
}

CompletionRequest Accepted(std::string_view body,
                           Endpoint endpoint = Endpoint::kCompletions) {
  ApiError error;
  auto parsed = ParseCompletionRequest(endpoint, body, RequestLimits{}, &error);
  INFO(error.message);
  REQUIRE(parsed.has_value());
  return *parsed;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("a body that is not a JSON object is a 400 that says so") {
  CHECK(Contains(Refused("{not json").message, "not valid JSON"));
  CHECK(Contains(Refused("[1, 2]").message, "must be a JSON object"));
  CHECK(Contains(Refused("").message, "not valid JSON"));
}

TEST_CASE("the prompt is a string or token ids; one prompt per request") {
  CHECK(Accepted(R"({"prompt": "12+3="})").prompt_text == "12+3=");
  const CompletionRequest ids = Accepted(R"({"prompt": [1, 2, 3]})");
  CHECK(ids.prompt_is_ids);
  CHECK(ids.prompt_ids == std::vector<int32_t>{1, 2, 3});
  CHECK(Accepted(R"({"prompt": [[4, 5]]})").prompt_ids ==
        std::vector<int32_t>{4, 5});
  CHECK(Refused(R"({"max_tokens": 3})").param == "prompt");
  CHECK(Contains(Refused(R"({"prompt": 7})").message,
                 "'prompt' must be a string or an array of token ids, got 7"));
  CHECK(Contains(Refused(R"({"prompt": [1, -2]})").message, "prompt[1]"));
  CHECK(Contains(Refused(R"({"prompt": ["a", "b"]})").message,
                 "one prompt per request"));
  CHECK(Contains(Refused(R"({"prompt": ""})").message, "empty"));
}

TEST_CASE("wrong types name the field and the value") {
  ApiError e = Refused(R"({"prompt": "x", "max_tokens": "16"})");
  CHECK(e.param == "max_tokens");
  CHECK(e.message == "'max_tokens' must be an integer, got \"16\"");
  e = Refused(R"({"prompt": "x", "temperature": true})");
  CHECK(e.message == "'temperature' must be a number, got true");
  e = Refused(R"({"prompt": "x", "stream": "yes"})");
  CHECK(e.param == "stream");
  e = Refused(R"({"prompt": "x", "seed": 1.5})");
  CHECK(e.param == "seed");
  // 8.0 from a client that builds numbers as floats is still 8.
  CHECK(*Accepted(R"({"prompt": "x", "max_tokens": 8.0})").max_tokens == 8);
}

TEST_CASE("n, max_tokens, temperature and top_p out of range are 400") {
  CHECK(Refused(R"({"prompt": "x", "n": 0})").message ==
        "'n' must be in [1, 16], got 0");
  CHECK(Refused(R"({"prompt": "x", "n": 17})").param == "n");
  CHECK(Refused(R"({"prompt": "x", "max_tokens": 0})").message ==
        "'max_tokens' must be in [1, 2147483647], got 0");
  CHECK(Refused(R"({"prompt": "x", "max_tokens": -5})").param == "max_tokens");
  CHECK(Refused(R"({"prompt": "x", "temperature": 2.5})").param ==
        "temperature");
  CHECK(Refused(R"({"prompt": "x", "top_p": 0})").param == "top_p");
  CHECK(Refused(R"({"prompt": "x", "top_p": 1.5})").param == "top_p");
  const CompletionRequest ok = Accepted(
      R"({"prompt": "x", "n": 16, "max_tokens": 5, "temperature": 0,
          "top_p": 0.9, "seed": 42})");
  CHECK(ok.n == 16);
  CHECK(*ok.max_tokens == 5);
  CHECK(ok.temperature == 0.0);
  CHECK(ok.top_p == Approx(0.9));
  CHECK(*ok.seed == 42);
}

TEST_CASE("stop is a string or a list of up to four non-empty strings") {
  CHECK(Accepted(R"({"prompt": "x", "stop": "\n"})").stop ==
        std::vector<std::string>{"\n"});
  CHECK(Accepted(R"({"prompt": "x", "stop": ["a", "bc"]})").stop ==
        std::vector<std::string>{"a", "bc"});
  CHECK(Accepted(R"({"prompt": "x", "stop": null})").stop.empty());
  CHECK(Contains(Refused(R"({"prompt": "x", "stop": ["a", 1]})").message,
                 "'stop' must be a string or an array of strings"));
  CHECK(Contains(
      Refused(R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})").message,
      "'stop' has 5 strings; the limit is 4"));
  CHECK(Refused(R"({"prompt": "x", "stop": [""]})").param == "stop");
  CHECK(Refused(R"({"prompt": "x", "stop": 3})").param == "stop");
}

TEST_CASE("logprobs: the sampled tokens' yes, top alternatives refused") {
  CHECK(Accepted(R"({"prompt": "x", "logprobs": 0})").want_logprobs);
  CHECK_FALSE(Accepted(R"({"prompt": "x", "logprobs": null})").want_logprobs);
  CHECK(Contains(Refused(R"({"prompt": "x", "logprobs": 3})").message,
                 "does not compute"));
  CHECK(Refused(R"({"prompt": "x", "logprobs": true})").param == "logprobs");
  const auto chat = Endpoint::kChatCompletions;
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  CHECK(Accepted("{" + msgs + R"(, "logprobs": true, "top_logprobs": 0})", chat)
            .want_logprobs);
  CHECK(Refused("{" + msgs + R"(, "logprobs": true, "top_logprobs": 2})", chat)
            .param == "top_logprobs");
  CHECK(Refused("{" + msgs + R"(, "logprobs": 1})", chat).param == "logprobs");
}

TEST_CASE("chat messages must be objects with a string role") {
  const auto chat = Endpoint::kChatCompletions;
  CHECK(Refused(R"({"messages": []})", chat).param == "messages");
  CHECK(Refused(R"({"model": "m"})", chat).param == "messages");
  CHECK(Refused(R"({"messages": ["hi"]})", chat).param == "messages[0]");
  CHECK(Refused(R"({"messages": [{"content": "hi"}]})", chat).param ==
        "messages[0].role");
  CHECK(Refused(R"({"messages": [{"role": "user", "content": 5}]})", chat)
            .param == "messages[0].content");
  CHECK(
      Refused(R"({"messages": [{"role": "user"}], "tools": {}})", chat).param ==
      "tools");
  const CompletionRequest r = Accepted(
      R"({"messages": [{"role": "user", "content": "hi"}],
          "max_completion_tokens": 7,
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
      chat);
  CHECK(*r.max_tokens == 7);
  CHECK(r.tools.size() == 1);
}

TEST_CASE(
    "fields clients commonly send are accepted; unsupported ones say so") {
  const CompletionRequest r = Accepted(
      R"({"prompt": "x", "model": "whatever", "user": "u", "stream": false,
          "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {},
          "best_of": 1, "echo": false, "suffix": null, "metadata": {"a": 1},
          "stream_options": {"include_usage": true}, "store": false,
          "some_future_field": [1, 2]})");
  CHECK(r.model == "whatever");
  CHECK(r.include_usage);
  CHECK(Contains(Refused(R"({"prompt": "x", "presence_penalty": 0.5})").message,
                 "no penalties"));
  CHECK(Refused(R"({"prompt": "x", "logit_bias": {"5": 10}})").param ==
        "logit_bias");
  CHECK(Refused(R"({"prompt": "x", "echo": true})").param == "echo");
  CHECK(Refused(R"({"prompt": "x", "best_of": 3})").param == "best_of");
}

TEST_CASE("tandem_episode_id names a harness episode; its turn is one sample") {
  CHECK(Accepted(R"({"prompt": "1+1=", "tandem_episode_id": "ep-1"})")
            .episode_id == "ep-1");
  CHECK(Accepted(R"({"prompt": "1+1="})").episode_id.empty());
  ApiError e =
      Refused(R"({"prompt": "1+1=", "n": 2, "tandem_episode_id": "ep-1"})");
  CHECK(e.param == "n");
  CHECK(Contains(e.message, "'n' must be 1, got 2"));
  CHECK(
      Contains(Refused(R"({"prompt": "1+1=", "tandem_episode_id": 7})").message,
               "tandem_episode_id"));
}

TEST_CASE("the error body has OpenAI's shape") {
  ApiError e;
  e.message = "m";
  e.param = "n";
  const Json body = ErrorBody(e);
  CHECK(body["error"]["message"] == "m");
  CHECK(body["error"]["type"] == "invalid_request_error");
  CHECK(body["error"]["param"] == "n");
  CHECK(body["error"]["code"].is_null());
}

TEST_CASE("responses carry the extension fields; invalid UTF-8 is replaced") {
  CompletionRequest request = Accepted(R"({"prompt": "x", "logprobs": 0})");
  ChoiceResult c;
  c.text = "ab\xff";
  c.token_ids = {1, 2};
  c.logprobs = {-0.5f, -1.0f};
  c.policy_versions = {3, 4};
  c.token_strings = {"a", "b"};
  c.finish_reason = "length";
  const Json body =
      CompletionResponse(request, {"cmpl-1", 5, "m"}, {7, 8}, {c});
  const Json& choice = body["choices"][0];
  CHECK(choice["token_ids"] == Json({1, 2}));
  CHECK(choice["policy_versions"] == Json({3, 4}));
  CHECK(choice["behavior_logprobs"].size() == 2);
  CHECK(choice["logprobs"]["token_logprobs"].size() == 2);
  CHECK(body["prompt_token_ids"] == Json({7, 8}));
  CHECK(body["usage"]["total_tokens"] == 4);
  CHECK(Contains(Dump(body), "ab\xEF\xBF\xBD"));
}

TEST_CASE("tools turn on tool-call parsing unless tool_choice is none") {
  const std::string messages =
      R"("messages": [{"role": "user", "content": "x"}])";
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  CHECK_FALSE(Accepted("{" + messages + "}", Endpoint::kChatCompletions)
                  .parse_tool_calls);
  CHECK(
      Accepted("{" + messages + ", " + tools + "}", Endpoint::kChatCompletions)
          .parse_tool_calls);
  CHECK_FALSE(Accepted("{" + messages + R"(, "tools": [])" + "}",
                       Endpoint::kChatCompletions)
                  .parse_tool_calls);
  CHECK_FALSE(Accepted("{" + messages + ", " + tools +
                           R"(, "tool_choice": "none")" + "}",
                       Endpoint::kChatCompletions)
                  .parse_tool_calls);
  CHECK(Accepted("{" + messages + ", " + tools +
                     R"(, "tool_choice": "required")" + "}",
                 Endpoint::kChatCompletions)
            .parse_tool_calls);
}

TEST_CASE("a chat choice with tool calls: content null, OpenAI's call shape") {
  CompletionRequest request =
      Accepted(R"({"messages": [{"role": "user", "content": "x"}]})",
               Endpoint::kChatCompletions);
  ChoiceResult c;
  c.token_ids = {1};
  c.finish_reason = "tool_calls";
  c.tool_calls = {{.id = "call_7_0_0",
                   .name = "calculator",
                   .arguments_json = R"({"expression":"1+2"})"}};
  const Json body =
      CompletionResponse(request, {"chatcmpl-7", 5, "m"}, {9}, {c});
  const Json& message = body["choices"][0]["message"];
  CHECK(message["content"].is_null());
  CHECK(body["choices"][0]["finish_reason"] == "tool_calls");
  REQUIRE(message["tool_calls"].size() == 1);
  CHECK(message["tool_calls"][0]["id"] == "call_7_0_0");
  CHECK(message["tool_calls"][0]["type"] == "function");
  CHECK(message["tool_calls"][0]["function"]["name"] == "calculator");
  CHECK(message["tool_calls"][0]["function"]["arguments"] ==
        R"({"expression":"1+2"})");
  // Text besides the calls stays content.
  c.text = "let me compute";
  const Json with_text =
      CompletionResponse(request, {"chatcmpl-7", 5, "m"}, {9}, {c});
  CHECK(with_text["choices"][0]["message"]["content"] == "let me compute");
}

}  // namespace
}  // namespace tandem::rollout::openai
