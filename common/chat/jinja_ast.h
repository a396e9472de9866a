#pragma once

// The syntax tree of a parsed chat template (a Jinja subset). Expressions
// and statements carry the line and column where they start, so render
// errors can name the place in the template.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/chat/value.h"

namespace tandem::chat {

struct SourcePos {
  int line = 1;
  int column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    kLiteral,   // literal
    kName,      // name
    kList,      // args (list and tuple literals)
    kDict,      // args: key, value, key, value...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    kCall,      // args[0](args[1:], kwargs)
    kFilter,    // args[0] | name(args[1:], kwargs)
    kTest,      // args[0] is [not] name(args[1:])
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] name args[1], name in + - * / // % ** ~
    kCompare,   // args[0] name args[1], name in == != < <= > >= in notin
    kAnd,
    kOr,
    kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Type type;
  SourcePos pos;
  Value literal;
  std::string name;
  bool negated = false;  // `is not`
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Type {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (cond, body)...; else_body
    kFor,       // targets in expr [if cond]: body; else_body
    kSet,       // targets = expr, or target.attr = expr
    kSetBlock,  // {% set target %}body{% endset %}
    kMacro,     // {% macro name(params) %}body{% endmacro %}
    kBreak,
    kContinue,
    kBlock,     // body rendered as is ({% generation %})
  };
  Type type;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace attribute
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro defaults
};

// A macro defined by {% macro %}: a callable value that renders its body.
struct Macro {
  std::string name;
  // Owned by the template that defined it; nullptr for a built-in global
  // function (raise_exception, strftime_now, namespace, range, dict).
  const Node* node = nullptr;
};

}  // namespace tandem::chat
