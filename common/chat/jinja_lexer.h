#pragma once

// Splits a chat template into text and tag tokens the way jinja2 does with
// transformers' settings (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False): whitespace control (`{%-`, `-%}`, `{{-`,
// `-}}`, `{#-`, `-#}`, `{%+`) is applied here, so the parser sees final text.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"

namespace tandem::chat {

struct Token {
  enum class Type {
    kText,
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,
    kInt,
    kFloat,
    kOperator,
    kEnd,
  };
  Type type;
  std::string text;  // Text, name, operator, or the unescaped string.
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

// `name` is used in error messages ("<name>:3:14: unclosed string").
absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source,
                                               std::string_view name);

}  // namespace tandem::chat
