#include "common/chat/jinja_expression_parser.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::chat::jinja_internal {

ExprPtr ExpressionParser::Make(Expr::Type type, SourcePos pos) {
  auto e = std::make_unique<Expr>();
  e->type = type;
  e->pos = pos;
  return e;
}

ExprPtr ExpressionParser::ParseTupleOrExpression() {
  SourcePos pos = Cur().pos;
  ExprPtr first = ParseExpression();
  if (!IsOp(",")) return first;
  ExprPtr list = Make(Expr::Type::kList, pos);
  list->args.push_back(std::move(first));
  while (IsOp(",")) {
    Next();
    list->args.push_back(ParseExpression());
  }
  return list;
}

ExprPtr ExpressionParser::ParseExpression(bool with_condexpr) {
  DepthGuard guard(this);
  ExprPtr expr = ParseOr();
  if (!with_condexpr) return expr;
  while (IsName("if")) {
    SourcePos pos = Cur().pos;
    Next();
    ExprPtr cond = ParseOr();
    ExprPtr e = Make(Expr::Type::kCondExpr, pos);
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(expr));
    if (IsName("else")) {
      Next();
      e->args.push_back(ParseExpression());
    } else {
      e->args.push_back(nullptr);
    }
    expr = std::move(e);
  }
  return expr;
}

ExprPtr ExpressionParser::Binary(Expr::Type type, std::string op, ExprPtr lhs,
                                 ExprPtr rhs, SourcePos pos) {
  ExprPtr e = Make(type, pos);
  e->name = std::move(op);
  e->args.push_back(std::move(lhs));
  e->args.push_back(std::move(rhs));
  return e;
}

ExprPtr ExpressionParser::ParseOr() {
  ExprPtr lhs = ParseAnd();
  while (IsName("or")) {
    SourcePos pos = Next().pos;
    lhs = Binary(Expr::Type::kOr, "or", std::move(lhs), ParseAnd(), pos);
  }
  return lhs;
}

ExprPtr ExpressionParser::ParseAnd() {
  ExprPtr lhs = ParseNot();
  while (IsName("and")) {
    SourcePos pos = Next().pos;
    lhs = Binary(Expr::Type::kAnd, "and", std::move(lhs), ParseNot(), pos);
  }
  return lhs;
}

ExprPtr ExpressionParser::ParseNot() {
  if (IsName("not")) {
    DepthGuard guard(this);
    ExprPtr e = Make(Expr::Type::kNot, Next().pos);
    e->args.push_back(ParseNot());
    return e;
  }
  return ParseCompare();
}

ExprPtr ExpressionParser::ParseCompare() {
  ExprPtr lhs = ParseMath1();
  while (true) {
    SourcePos pos = Cur().pos;
    std::string op;
    if (Cur().type == T::kOperator &&
        (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
         Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
      op = Next().text;
    } else if (IsName("in")) {
      Next();
      op = "in";
    } else if (IsName("not") && Peek().type == T::kName &&
               Peek().text == "in") {
      Next();
      Next();
      op = "notin";
    } else {
      return lhs;
    }
    lhs = Binary(Expr::Type::kCompare, op, std::move(lhs), ParseMath1(), pos);
  }
}

ExprPtr ExpressionParser::ParseMath1() {
  ExprPtr lhs = ParseConcat();
  while (IsOp("+") || IsOp("-")) {
    SourcePos pos = Cur().pos;
    std::string op = Next().text;
    lhs = Binary(Expr::Type::kBinary, op, std::move(lhs), ParseConcat(), pos);
  }
  return lhs;
}

ExprPtr ExpressionParser::ParseConcat() {
  ExprPtr lhs = ParseMath2();
  while (IsOp("~")) {
    SourcePos pos = Next().pos;
    lhs = Binary(Expr::Type::kBinary, "~", std::move(lhs), ParseMath2(), pos);
  }
  return lhs;
}

ExprPtr ExpressionParser::ParseMath2() {
  ExprPtr lhs = ParsePow();
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    SourcePos pos = Cur().pos;
    std::string op = Next().text;
    lhs = Binary(Expr::Type::kBinary, op, std::move(lhs), ParsePow(), pos);
  }
  return lhs;
}

ExprPtr ExpressionParser::ParsePow() {
  ExprPtr lhs = ParseUnary(true);
  while (IsOp("**")) {
    SourcePos pos = Next().pos;
    lhs = Binary(Expr::Type::kBinary, "**", std::move(lhs), ParseUnary(true),
                 pos);
  }
  return lhs;
}

ExprPtr ExpressionParser::ParseUnary(bool with_filter) {
  DepthGuard guard(this);
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    SourcePos pos = Cur().pos;
    Expr::Type type = Next().text == "-" ? Expr::Type::kNeg : Expr::Type::kPos;
    node = Make(type, pos);
    node->args.push_back(ParseUnary(false));
  } else {
    node = ParsePrimary();
  }
  node = ParsePostfix(std::move(node));
  if (with_filter) node = ParseFilterExpr(std::move(node));
  return node;
}

ExprPtr ExpressionParser::ParsePrimary() {
  const Token& t = Cur();
  SourcePos pos = t.pos;
  switch (t.type) {
    case T::kName: {
      std::string name = Next().text;
      ExprPtr e = Make(Expr::Type::kLiteral, pos);
      if (name == "true" || name == "True") {
        e->literal = Value(true);
      } else if (name == "false" || name == "False") {
        e->literal = Value(false);
      } else if (name == "none" || name == "None") {
        e->literal = Value::None();
      } else {
        e->type = Expr::Type::kName;
        e->name = std::move(name);
      }
      return e;
    }
    case T::kString: {
      std::string s;
      while (Cur().type == T::kString) s += Next().text;
      ExprPtr e = Make(Expr::Type::kLiteral, pos);
      e->literal = Value(std::move(s));
      return e;
    }
    case T::kInt: {
      ExprPtr e = Make(Expr::Type::kLiteral, pos);
      e->literal = Value(Next().int_value);
      return e;
    }
    case T::kFloat: {
      ExprPtr e = Make(Expr::Type::kLiteral, pos);
      e->literal = Value(Next().float_value);
      return e;
    }
    case T::kOperator:
      if (t.text == "(") {
        Next();
        if (IsOp(")")) {
          Next();
          return Make(Expr::Type::kList, pos);
        }
        ExprPtr first = ParseExpression();
        if (IsOp(")")) {
          Next();
          return first;
        }
        ExprPtr tuple = Make(Expr::Type::kList, pos);
        tuple->args.push_back(std::move(first));
        while (IsOp(",")) {
          Next();
          if (IsOp(")")) break;
          tuple->args.push_back(ParseExpression());
        }
        ExpectOp(")");
        return tuple;
      }
      if (t.text == "[") {
        Next();
        ExprPtr list = Make(Expr::Type::kList, pos);
        while (!IsOp("]")) {
          list->args.push_back(ParseExpression());
          if (!IsOp(",")) break;
          Next();
        }
        ExpectOp("]");
        return list;
      }
      if (t.text == "{") {
        Next();
        ExprPtr dict = Make(Expr::Type::kDict, pos);
        while (!IsOp("}")) {
          dict->args.push_back(ParseExpression());
          ExpectOp(":");
          dict->args.push_back(ParseExpression());
          if (!IsOp(",")) break;
          Next();
        }
        ExpectOp("}");
        return dict;
      }
      break;
    default:
      break;
  }
  Fail(absl::StrCat("unexpected ", Describe(t), " in expression"));
}

void ExpressionParser::ParseCallArgs(Expr* call) {
  ExpectOp("(");
  while (!IsOp(")")) {
    if (Cur().type == T::kName && Peek().type == T::kOperator &&
        Peek().text == "=") {
      std::string key = Next().text;
      Next();
      call->kwargs.emplace_back(std::move(key), ParseExpression());
    } else {
      if (!call->kwargs.empty()) {
        Fail("positional argument after keyword argument");
      }
      call->args.push_back(ParseExpression());
    }
    if (!IsOp(",")) break;
    Next();
  }
  ExpectOp(")");
}

ExprPtr ExpressionParser::ParsePostfix(ExprPtr node) {
  while (true) {
    SourcePos pos = Cur().pos;
    if (IsOp(".")) {
      Next();
      ExprPtr e = Make(Expr::Type::kGetAttr, pos);
      if (Cur().type == T::kInt) {
        e->type = Expr::Type::kGetItem;
        ExprPtr index = Make(Expr::Type::kLiteral, Cur().pos);
        index->literal = Value(Next().int_value);
        e->args.push_back(std::move(node));
        e->args.push_back(std::move(index));
      } else {
        e->name = ExpectName();
        e->args.push_back(std::move(node));
      }
      node = std::move(e);
    } else if (IsOp("[")) {
      Next();
      ExprPtr parts[3];
      bool is_slice = false;
      for (int i = 0; i < 3; ++i) {
        if (!IsOp(":") && !IsOp("]")) parts[i] = ParseExpression();
        if (i < 2 && IsOp(":")) {
          is_slice = true;
          Next();
        } else {
          break;
        }
      }
      ExpectOp("]");
      ExprPtr e =
          Make(is_slice ? Expr::Type::kSlice : Expr::Type::kGetItem, pos);
      e->args.push_back(std::move(node));
      if (!is_slice && !parts[0]) Fail(pos, "empty subscript");
      e->args.push_back(std::move(parts[0]));
      if (is_slice) {
        e->args.push_back(std::move(parts[1]));
        e->args.push_back(std::move(parts[2]));
      }
      node = std::move(e);
    } else if (IsOp("(")) {
      // Calls are reported at the callee ("raise_exception(...)").
      ExprPtr e = Make(Expr::Type::kCall, node->pos);
      e->args.push_back(std::move(node));
      ParseCallArgs(e.get());
      node = std::move(e);
    } else {
      return node;
    }
  }
}

ExprPtr ExpressionParser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    SourcePos pos = Cur().pos;
    if (IsOp("|")) {
      Next();
      ExprPtr e = Make(Expr::Type::kFilter, pos);
      e->name = ExpectName();
      while (IsOp(".")) {
        Next();
        e->name += "." + ExpectName();
      }
      e->args.push_back(std::move(node));
      if (IsOp("(")) ParseCallArgs(e.get());
      node = std::move(e);
    } else if (IsName("is")) {
      Next();
      ExprPtr e = Make(Expr::Type::kTest, pos);
      if (IsName("not")) {
        Next();
        e->negated = true;
      }
      e->name = ExpectName();
      e->args.push_back(std::move(node));
      if (IsOp("(")) {
        ParseCallArgs(e.get());
      } else if ((Cur().type == T::kName || Cur().type == T::kString ||
                  Cur().type == T::kInt || Cur().type == T::kFloat ||
                  IsOp("[") || IsOp("{")) &&
                 !IsName("else") && !IsName("or") && !IsName("and") &&
                 !IsName("if") && !IsName("in") && !IsName("not") &&
                 !IsName("is")) {
        ExprPtr arg = ParsePostfix(ParsePrimary());
        e->args.push_back(std::move(arg));
      }
      node = std::move(e);
    } else if (IsOp("(")) {
      ExprPtr e = Make(Expr::Type::kCall, pos);
      e->args.push_back(std::move(node));
      ParseCallArgs(e.get());
      node = std::move(e);
    } else {
      return node;
    }
  }
}

}  // namespace tandem::chat::jinja_internal
