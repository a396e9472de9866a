// Unit tests of the chat-template engine (common/chat): each language
// feature on a small template, error messages, and limits. The expected
// strings were produced by jinja2 3.1.6 configured as transformers 5.24.0
// configures it (trim_blocks, lstrip_blocks, its tojson); the comparison on
// real templates is chat_template_reference.

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/chat/chat_template.h"

namespace tandem::chat {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> Render(const std::string& source, const std::string& context_json,
                                   const RenderLimits& limits = {}) {
  auto tmpl = ChatTemplate::Parse(source, "t");
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(Json::parse(context_json), limits);
}

struct FeatureCase {
  const char* name;
  const char* source;
  const char* context;
  const char* expected;
};

// Language features, each rendered as jinja2 renders it.
const FeatureCase kFeatureCases[] = {
    {"lstrip_trim", R"J(  {% if true %}
A
  {% endif %}
B
)J",
     R"J({})J",
     R"J(A
B)J"},
    {"dash_control", R"J(a  {{- ' b ' -}}  c
{%- if true -%}
  d
{%- endif %})J",
     R"J({})J",
     R"J(a b cd)J"},
    {"plus_disables_lstrip", R"J(  {%+ if true %}x{% endif %})J",
     R"J({})J",
     R"J(  x)J"},
    {"comment_trim", R"J(a
  {# note #}
b)J",
     R"J({})J",
     R"J(a
b)J"},
    {"trailing_newline", R"J(x
)J",
     R"J({})J",
     R"J(x)J"},
    {"loop_vars", R"J({% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %})J",
     R"J({"xs": ["a", "b"]})J",
     R"J(01TrueFalse2;12FalseTrue2;)J"},
    {"loop_filter_else", R"J({% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %})J",
     R"J({"xs": [1, 2, 3]})J",
     R"J(23|empty)J"},
    {"loop_scope", R"J({% set x = 0 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }})J",
     R"J({})J",
     R"J([0][0]0)J"},
    {"namespace", R"J({% set ns = namespace(n=0, s='') %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }})J",
     R"J({})J",
     R"J(6)J"},
    {"break_continue", R"J({% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %})J",
     R"J({})J",
     R"J(023)J"},
    {"slices", R"J({{ s[::-1] }}|{{ xs[1:] }}|{{ xs[-1] }}|{{ s[1:3] }}|{{ xs[::2] }})J",
     R"J({"s": "héllo", "xs": [1, 2, 3, 4]})J",
     R"J(olléh|[2, 3, 4]|4|él|[1, 3])J"},
    {"operators", R"J({{ 7 // 2 }} {{ -7 % 3 }} {{ 3 / 2 }} {{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }} {{ 1 + 2 * 3 }} {{ 'ab' * 2 }})J",
     R"J({})J",
     R"J(3 2 1.5 1024 a1None 7 abab)J"},
    {"logic", R"J({{ 1 in [1,2] }} {{ 'b' not in 'abc' }} {{ not true or false }} {{ none is none }} {{ x is not defined }} {{ 1 == 1.0 }})J",
     R"J({})J",
     R"J(True False False True True True)J"},
    {"condexpr", R"J({{ 'y' if x else 'n' }}{{ 'z' if false }}|)J",
     R"J({"x": 1})J",
     R"J(y|)J"},
    {"str_values", R"J({{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v'} }} {{ 0.1 + 0.2 }} {{ 1e20 }})J",
     R"J({})J",
     R"J([1, 'a', None, True, 1.5] {'k': 'v'} 0.30000000000000004 1e+20)J"},
    {"tojson", R"J({{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é"\n' | tojson }}|{{ [] | tojson(indent=2) }})J",
     R"J({"d": {"b": [1, 2.5, null, true], "a": {"x": "ü"}}})J",
     R"J({"b": [1, 2.5, null, true], "a": {"x": "ü"}}|{
  "b": [
    1,
    2.5,
    null,
    true
  ],
  "a": {
    "x": "ü"
  }
}|"é\"\n"|[])J"},
    {"string_methods", R"J({{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x','c')) }}|{{ 'aXa'.replace('a','b') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }})J",
     R"J({})J",
     R"J(a b|['a', 'b', '', 'c']|['a', 'b']|hixx|True|True|bXb|ABab)J"},
    {"dict_methods", R"J({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.keys() | list }})J",
     R"J({"d": {"a": 1, "b": 2}})J",
     R"J(a=1;b=2;1dflt['a', 'b'])J"},
    {"filters", R"J({{ ' x ' | trim }}|{{ xs | length }}|{{ u | default('d') }}|{{ '' | default('d', true) }}|{{ 5 | string }}|{{ xs | join(', ') }}|{{ xs | first }}{{ xs | last }}|{{ 'ab' | upper }})J",
     R"J({"xs": ["p", "q"]})J",
     R"J(x|2|d|d|5|p, q|pq|AB)J"},
    {"map_select", R"J({{ ms | map(attribute='role') | join(',') }}|{{ ms | selectattr('role', 'equalto', 'user') | list | length }}|{{ ms | rejectattr('content') | map(attribute='role') | list }})J",
     R"J({"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]})J",
     R"J(user,assistant|1|['assistant'])J"},
    {"tests", R"J({{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ [] is sequence }}{{ 1 is number }}{{ true is boolean }}{{ true is true }}{{ 0 is false }}{{ none is none }})J",
     R"J({})J",
     R"J(TrueTrueTrueTrueTrueTrueTrueFalseTrue)J"},
    {"macro", R"J({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }})J",
     R"J({})J",
     R"J(Hi A! Hi B?)J"},
    {"set_block", R"J({% set x %}a{{ 1 }}b{% endset %}[{{ x }}])J",
     R"J({})J",
     R"J([a1b])J"},
    {"undefined_ok", R"J([{{ missing }}][{{ missing | length }}][{% for x in missing %}x{% endfor %}][{{ missing is defined }}])J",
     R"J({})J",
     R"J([][0][][False])J"},
};

TEST_CASE("ChatTemplateRendersEachFeatureLikeJinja2", "[chat]") {
  for (const FeatureCase& c : kFeatureCases) {
    INFO(c.name);
    auto out = Render(c.source, c.context);
    REQUIRE(out.ok());
    CHECK(*out == c.expected);
  }
}

std::string ErrorOf(const std::string& source, const std::string& context = "{}") {
  auto out = Render(source, context);
  REQUIRE_FALSE(out.ok());
  return std::string(out.status().message());
}

TEST_CASE("ChatTemplateErrorsNameTemplateLineAndColumn", "[chat]") {
  CHECK(ErrorOf("a\n{% if x %}b") ==
        "t:2:4: unclosed '{% if %}': expected '{% endif %}' before the end of the template");
  CHECK(ErrorOf("{{ x | nosuch }}") == "t:1:6: no filter named 'nosuch'");
  CHECK(ErrorOf("{{ x is nosuch }}") == "t:1:6: no test named 'nosuch'");
  CHECK(ErrorOf("line1\n  {{ raise_exception('Only user and assistant roles') }}") ==
        "t:2:6: raise_exception: Only user and assistant roles");
  CHECK(ErrorOf("{% endfor %}") == "t:1:4: unexpected '{% endfor %}' with no open block");
  CHECK(ErrorOf("{% for x in y %}{% endif %}") ==
        "t:1:20: unexpected '{% endif %}', expected '{% endfor %}'");
  CHECK(ErrorOf("{{ 'abc }}") == "t:1:4: unclosed string literal");
  CHECK(ErrorOf("{{ x ") == "t:1:1: unclosed '{{' (missing '}}')");
  CHECK(ErrorOf("{# x") == "t:1:1: unclosed comment");
  CHECK(ErrorOf("{% frobnicate %}") == "t:1:4: unknown or unsupported tag 'frobnicate'");
  CHECK(ErrorOf("{{ m.a.b }}", R"({"m": {}})") == "t:1:7: 'dict object' has no attribute 'a'");
  CHECK(ErrorOf("{{ 'a' + 1 }}") == "t:1:8: unsupported operand type(s) for +: 'str' and 'int'");
  CHECK(ErrorOf("{{ (1, 2 }}") == "t:1:1: unclosed '{{' (missing '}}'); '(' still open inside it");
  CHECK(ErrorOf("{{ (1, 2 ] + 3 ) }}") == "t:1:10: expected ')', got ']'");
}

TEST_CASE("ChatTemplateRejectsHostileInputWithinLimits", "[chat]") {
  // Deep nesting is refused by the parser instead of exhausting the stack.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  CHECK(ErrorOf(deep).find("nested too deeply") != std::string::npos);
  std::string deep_ifs;
  for (int i = 0; i < 1000; ++i) deep_ifs += "{% if true %}";
  CHECK(ErrorOf(deep_ifs).find("nested too deeply") != std::string::npos);
  // Output and work are bounded.
  RenderLimits small;
  small.max_output_bytes = 1000;
  auto big = Render("{% for i in range(100) %}{% for j in range(100) %}xx{% endfor %}{% endfor %}", "{}", small);
  REQUIRE_FALSE(big.ok());
  CHECK(std::string(big.status().message()).find("output exceeds 1000 bytes") != std::string::npos);
  CHECK_FALSE(Render("{{ 'x' * 100000000000 }}", "{}").ok());
  RenderLimits few_steps;
  few_steps.max_steps = 10000;
  auto slow = Render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "{}", few_steps);
  REQUIRE_FALSE(slow.ok());
  CHECK(std::string(slow.status().message()).find("evaluation steps") != std::string::npos);
  // Values too deep to print or free recursively are refused, whether the
  // template builds them or the context brings them.
  auto nested = Render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", "{}");
  REQUIRE_FALSE(nested.ok());
  CHECK(std::string(nested.status().message()).find("value nested deeper than 256 levels") != std::string::npos);
  std::string deep_json = std::string(300, '[') + std::string(300, ']');
  auto deep_context = Render("x", R"({"a": )" + deep_json + "}");
  REQUIRE_FALSE(deep_context.ok());
  CHECK(std::string(deep_context.status().message()) == "render context is nested deeper than 256 levels");
  std::string very_deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_FALSE(Render("x", R"({"a": )" + very_deep + "}").ok());
  // Unbounded macro recursion stops at the call-depth limit.
  auto rec = Render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{}");
  REQUIRE_FALSE(rec.ok());
  CHECK(std::string(rec.status().message()).find("macro calls nested deeper") != std::string::npos);
  // Deep expressions inside recursive macros stop at the evaluation depth
  // limit, so the stack stays small on any thread.
  std::string deep_macro = "{% macro f(n) %}{% if n > 0 %}{{ " + std::string(190, '-') +
                           "f(n - 1)|length }}{% endif %}{% endmacro %}{{ f(1000) }}";
  auto deep_rec = Render(deep_macro, "{}");
  REQUIRE_FALSE(deep_rec.ok());
  CHECK(std::string(deep_rec.status().message()).find("evaluation nested deeper than 1000 levels") != std::string::npos);
}

TEST_CASE("ApplyChatTemplateBuildsTransformersContext", "[chat]") {
  auto tmpl = ChatTemplate::Parse(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}"
      "{% if m.thinking is defined %}({{ m.thinking }}|{{ m.reasoning_content }}){% endif %}"
      "{% if m.tool_calls is defined %}[calls]{% endif %};{% endfor %}"
      "{{ tools is none }}{{ documents is none }}{% if add_generation_prompt %}>{% endif %}{{ flag }}",
      "ctx");
  REQUIRE(tmpl.ok());
  ChatTemplateInputs inputs;
  inputs.messages = Json::parse(R"([{"role": "user", "content": "hi", "tool_calls": null},
                                    {"role": "assistant", "content": "ok", "reasoning": "why"}])");
  inputs.add_generation_prompt = true;
  inputs.extra = Json::parse(R"({"flag": 7})");
  auto out = ApplyChatTemplate(*tmpl, inputs, {{"bos_token", "<s>"}});
  REQUIRE(out.ok());
  CHECK(*out == "<s>user:hi;assistant:ok(why|why);TrueTrue>7");
}

TEST_CASE("LoadChatTemplatesReadsStringListAndJinjaFile", "[chat]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("chat_template_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  write(dir / "tokenizer_config.json",
        R"({"bos_token": {"content": "<B>", "special": true}, "eos_token": "<E>",
            "chat_template": [{"name": "default", "template": "D{{ bos_token }}{{ eos_token }}"},
                              {"name": "tool_use", "template": "T"}]})");
  auto loaded = LoadChatTemplates(dir.string());
  REQUIRE(loaded.ok());
  CHECK(loaded->special_tokens.at("bos_token") == "<B>");
  auto def = loaded->Get();
  REQUIRE(def.ok());
  CHECK(*ApplyChatTemplate(**def, {}, loaded->special_tokens) == "D<B><E>");
  REQUIRE(loaded->Get("tool_use").ok());
  CHECK(loaded->Get("nope").status().message() == "no chat template named 'nope' (have: default, tool_use)");
  // chat_template.jinja, as newer transformers save it, wins over the config.
  write(dir / "chat_template.jinja", "J{{ eos_token }}\n");
  loaded = LoadChatTemplates(dir.string());
  REQUIRE(loaded.ok());
  CHECK(*ApplyChatTemplate(**loaded->Get(), {}, loaded->special_tokens) == "J<E>");
  // A broken template names the file it came from.
  write(dir / "chat_template.jinja", "{% if %}");
  auto broken = LoadChatTemplates(dir.string());
  REQUIRE_FALSE(broken.ok());
  CHECK(std::string(broken.status().message()).find("/default:1:7:") != std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::chat
