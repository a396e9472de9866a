#pragma once

// Internal to the chat-template parser: jinja2's expression grammar and
// precedence (conditional expressions, or/and/not, comparisons and `in`,
// arithmetic, `~`, `**`, unary signs, literals, lists, tuples, dicts,
// attribute and item access, slices, calls with keyword arguments, filters
// and tests). The statement parser (jinja_parser.cc) builds on it; these
// rules never parse a statement. Each nested expression counts towards
// kMaxParseDepth.

#include <string>
#include <vector>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_token_cursor.h"

namespace tandem::chat::jinja_internal {

class ExpressionParser : public TokenCursor {
 public:
  using TokenCursor::TokenCursor;

  // An expression, or a comma-separated tuple of them (a kList).
  ExprPtr ParseTupleOrExpression();
  // An expression, with `a if b else c` unless !with_condexpr.
  ExprPtr ParseExpression(bool with_condexpr = true);

 private:
  ExprPtr Make(Expr::Type type, SourcePos pos);
  ExprPtr Binary(Expr::Type type, std::string op, ExprPtr lhs, ExprPtr rhs,
                 SourcePos pos);
  ExprPtr ParseOr();
  ExprPtr ParseAnd();
  ExprPtr ParseNot();
  ExprPtr ParseCompare();
  ExprPtr ParseMath1();
  ExprPtr ParseConcat();
  ExprPtr ParseMath2();
  ExprPtr ParsePow();
  ExprPtr ParseUnary(bool with_filter);
  ExprPtr ParsePrimary();
  void ParseCallArgs(Expr* call);
  ExprPtr ParsePostfix(ExprPtr node);
  ExprPtr ParseFilterExpr(ExprPtr node);
};

}  // namespace tandem::chat::jinja_internal
