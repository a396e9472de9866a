// RenderContinuation (common/chat/episode_render.h): the text an episode
// appends after a model turn, from the template's own rendering; and
// RenderOpening, what its opening observations add to a prompt. The
// expected strings were produced by Python jinja2 (trim_blocks,
// lstrip_blocks, as transformers configures it) from the same ChatML-style
// template with Qwen-like grouping of consecutive tool messages, written
// for this test.

#include <catch2/catch.hpp>
#include <string>

#include "common/chat/episode_render.h"

namespace tandem::chat {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kChatMl[] = R"TMPL({%- for m in messages %}
{%- if m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
)TMPL";

ChatTemplate MustParse(const std::string& source) {
  auto t = ChatTemplate::Parse(source, "t");
  REQUIRE(t.ok());
  return *t;
}

TEST_CASE(
    "two tool results render as one grouped user turn and the next "
    "assistant header, after the cached end-of-turn token") {
  const ChatTemplate t = MustParse(kChatMl);
  const Json obs = Json::parse(R"([
    {"role": "tool", "content": "9193", "tool_call_id": "call_1_0", "name": "calculator"},
    {"role": "tool", "content": "2", "tool_call_id": "call_1_1", "name": "calculator"}])");
  auto text = RenderContinuation(t, obs, "<|im_end|>");
  REQUIRE(text.ok());
  CHECK(*text ==
        "\n<|im_start|>user\n<tool_response>\n9193\n</tool_response>\n"
        "<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>"
        "assistant\n");
  auto user = RenderContinuation(
      t, Json::parse(R"([{"role": "user", "content": "try again"}])"),
      "<|im_end|>");
  REQUIRE(user.ok());
  CHECK(*user ==
        "\n<|im_start|>user\ntry again<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE(
    "a template that re-renders earlier turns, or a wrong end-of-turn "
    "text, is refused with the reason") {
  const ChatTemplate t = MustParse(kChatMl);
  auto missing = RenderContinuation(
      t, Json::parse(R"([{"role": "user", "content": "x"}])"), "<|eot_id|>");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("\"<|eot_id|>\" does not occur"));
  // Marks the last message: appending one changes the earlier rendering.
  const ChatTemplate marks_last = MustParse(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
      "{% if loop.last %} (last){% endif %}<|im_end|>\n{% endfor %}");
  auto changed = RenderContinuation(
      marks_last, Json::parse(R"([{"role": "user", "content": "x"}])"),
      "<|im_end|>");
  REQUIRE_FALSE(changed.ok());
  CHECK_THAT(std::string(changed.status().message()),
             Catch::Contains("changes how the earlier turns render"));
  auto not_array = RenderContinuation(t, Json::object(), "<|im_end|>");
  CHECK(not_array.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "opening observations render as the template renders them after a user "
    "turn, then the generation header; none is the header alone") {
  // Expected strings: Python jinja2 (trim_blocks, lstrip_blocks) on
  // kChatMl, the rendering of [user] + observations with
  // add_generation_prompt after that of [user].
  const ChatTemplate t = MustParse(kChatMl);
  auto user = RenderOpening(
      t, Json::parse(R"([{"role": "user", "content": "You are in room 3"}])"));
  REQUIRE(user.ok());
  CHECK(*user ==
        "<|im_start|>user\nYou are in room 3<|im_end|>\n<|im_start|>"
        "assistant\n");
  auto none = RenderOpening(t, Json::array());
  REQUIRE(none.ok());
  CHECK(*none == "<|im_start|>assistant\n");
  auto tools = RenderOpening(t, Json::parse(R"([
    {"role": "tool", "content": "board: X.O"},
    {"role": "tool", "content": "turn 1"}])"));
  REQUIRE(tools.ok());
  CHECK(*tools ==
        "<|im_start|>user\n<tool_response>\nboard: X.O\n</tool_response>\n"
        "<tool_response>\nturn 1\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n");
  const ChatTemplate marks_last = MustParse(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
      "{% if loop.last %} (last){% endif %}<|im_end|>\n{% endfor %}");
  auto changed = RenderOpening(
      marks_last, Json::parse(R"([{"role": "user", "content": "x"}])"));
  REQUIRE_FALSE(changed.ok());
  CHECK(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(changed.status().message()),
             Catch::Contains("changes how the prompt renders"));
  CHECK(RenderOpening(t, Json::object()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::chat
