#pragma once

// Parses lexed chat-template tokens into a syntax tree. Supported
// statements: if/elif/else, for (tuple targets, `if` filter, else, break,
// continue), set (name, tuple, namespace attribute, block), macro,
// generation (rendered as its body). Expressions follow jinja2's grammar
// and precedence. Nesting is bounded (kMaxParseDepth) so hostile input
// cannot exhaust the stack.

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_lexer.h"

namespace tandem::chat {

inline constexpr int kMaxParseDepth = 200;

absl::StatusOr<NodeList> ParseTemplate(const std::vector<Token>& tokens,
                                       std::string_view name);

}  // namespace tandem::chat
