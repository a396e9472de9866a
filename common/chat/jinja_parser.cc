#include "common/chat/jinja_parser.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::chat {
namespace {

// Thrown inside the parser only; ParseTemplate turns it into a Status.
struct ParseError {
  SourcePos pos;
  std::string what;
};

class Parser {
 public:
  Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  NodeList ParseAll() {
    NodeList nodes = ParseBody({});
    if (Cur().type != Token::Type::kEnd) Fail("unexpected tag");
    return nodes;
  }

 private:
  using T = Token::Type;

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t n = 1) const {
    return tokens_[std::min(pos_ + n, tokens_.size() - 1)];
  }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  [[noreturn]] void Fail(std::string what) const { throw ParseError{Cur().pos, std::move(what)}; }
  [[noreturn]] void Fail(SourcePos pos, std::string what) const { throw ParseError{pos, std::move(what)}; }

  bool IsOp(std::string_view op) const { return Cur().type == T::kOperator && Cur().text == op; }
  bool IsName(std::string_view name) const { return Cur().type == T::kName && Cur().text == name; }
  void ExpectOp(std::string_view op) {
    if (!IsOp(op)) Fail(absl::StrCat("expected '", std::string(op), "', got ", Describe(Cur())));
    Next();
  }
  std::string ExpectName() {
    if (Cur().type != T::kName) Fail(absl::StrCat("expected a name, got ", Describe(Cur())));
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) Fail(absl::StrCat("expected '%}', got ", Describe(Cur())));
    Next();
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kEnd: return "end of template";
      case T::kText: return "text";
      case T::kVarBegin: return "'{{'";
      case T::kVarEnd: return "'}}'";
      case T::kBlockBegin: return "'{%'";
      case T::kBlockEnd: return "'%}'";
      case T::kString: return "a string";
      case T::kInt:
      case T::kFloat: return absl::StrCat("number ", t.text);
      default: return absl::StrCat("'", t.text, "'");
    }
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxParseDepth) p->Fail("template nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  // Parses nodes until a block tag whose keyword is in `end_tags` (left
  // unconsumed, positioned at its keyword) or the end of the template.
  NodeList ParseBody(std::vector<std::string_view> end_tags) {
    DepthGuard guard(this);
    NodeList nodes;
    while (true) {
      const Token& t = Cur();
      if (t.type == T::kEnd) {
        if (!end_tags.empty()) {
          const auto& [word, pos] = open_blocks_.back();
          Fail(pos, absl::StrCat("unclosed '{% ", word, " %}': expected '{% ",
                                 std::string(end_tags.back()), " %}' before the end of the template"));
        }
        return nodes;
      }
      if (t.type == T::kText) {
        auto node = std::make_unique<Node>();
        node->type = Node::Type::kText;
        node->pos = t.pos;
        node->text = t.text;
        nodes.push_back(std::move(node));
        Next();
      } else if (t.type == T::kVarBegin) {
        auto node = std::make_unique<Node>();
        node->type = Node::Type::kOutput;
        node->pos = t.pos;
        Next();
        node->expr = ParseExpression();
        if (Cur().type != T::kVarEnd) Fail(absl::StrCat("expected '}}', got ", Describe(Cur())));
        Next();
        nodes.push_back(std::move(node));
      } else if (t.type == T::kBlockBegin) {
        const Token& keyword = Peek();
        if (keyword.type == T::kName) {
          for (std::string_view end : end_tags) {
            if (keyword.text == end) {
              Next();
              return nodes;
            }
          }
        }
        Next();
        nodes.push_back(ParseStatement(end_tags));
      } else {
        Fail(absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  std::unique_ptr<Node> ParseStatement(const std::vector<std::string_view>& outer_end_tags) {
    const Token& keyword = Cur();
    if (keyword.type != T::kName) Fail(absl::StrCat("expected a statement keyword, got ", Describe(keyword)));
    auto node = std::make_unique<Node>();
    node->pos = keyword.pos;
    std::string word = Next().text;
    open_blocks_.emplace_back(word, node->pos);
    struct PopOnExit {
      ~PopOnExit() { blocks->pop_back(); }
      std::vector<std::pair<std::string, SourcePos>>* blocks;
    } pop_on_exit{&open_blocks_};
    if (word == "if") {
      node->type = Node::Type::kIf;
      ExprPtr cond = ParseExpression();
      ExpectBlockEnd();
      while (true) {
        NodeList body = ParseBody({"elif", "else", "endif"});
        node->branches.emplace_back(std::move(cond), std::move(body));
        std::string end = Next().text;
        if (end == "elif") {
          cond = ParseExpression();
          ExpectBlockEnd();
          continue;
        }
        if (end == "else") {
          ExpectBlockEnd();
          node->else_body = ParseBody({"endif"});
          Next();
        }
        ExpectBlockEnd();
        break;
      }
    } else if (word == "for") {
      node->type = Node::Type::kFor;
      node->targets = ParseTargets();
      if (!IsName("in")) Fail(absl::StrCat("expected 'in' in for loop, got ", Describe(Cur())));
      Next();
      node->expr = ParseExpression(/*with_condexpr=*/false);
      if (IsName("if")) {
        Next();
        node->cond = ParseExpression();
      }
      if (IsName("recursive")) Fail("recursive for loops are not supported");
      ExpectBlockEnd();
      node->body = ParseBody({"else", "endfor"});
      if (Next().text == "else") {
        ExpectBlockEnd();
        node->else_body = ParseBody({"endfor"});
        Next();
      }
      ExpectBlockEnd();
    } else if (word == "set") {
      std::vector<std::string> targets = ParseTargets();
      if (targets.size() == 1 && IsOp(".")) {
        Next();
        node->attr = ExpectName();
      }
      node->targets = std::move(targets);
      if (Cur().type == T::kBlockEnd && node->targets.size() == 1 && node->attr.empty()) {
        node->type = Node::Type::kSetBlock;
        Next();
        node->body = ParseBody({"endset"});
        Next();
        ExpectBlockEnd();
      } else {
        node->type = Node::Type::kSet;
        ExpectOp("=");
        node->expr = ParseTupleOrExpression();
        ExpectBlockEnd();
      }
    } else if (word == "macro") {
      node->type = Node::Type::kMacro;
      node->text = ExpectName();
      ExpectOp("(");
      while (!IsOp(")")) {
        std::string param = ExpectName();
        ExprPtr def;
        if (IsOp("=")) {
          Next();
          def = ParseExpression();
        }
        node->params.emplace_back(std::move(param), std::move(def));
        if (!IsOp(",")) break;
        Next();
      }
      ExpectOp(")");
      ExpectBlockEnd();
      node->body = ParseBody({"endmacro"});
      Next();
      if (Cur().type == T::kName) Next();
      ExpectBlockEnd();
    } else if (word == "generation") {
      node->type = Node::Type::kBlock;
      ExpectBlockEnd();
      node->body = ParseBody({"endgeneration"});
      Next();
      ExpectBlockEnd();
    } else if (word == "break" || word == "continue") {
      node->type = word == "break" ? Node::Type::kBreak : Node::Type::kContinue;
      ExpectBlockEnd();
    } else {
      bool is_end = word.rfind("end", 0) == 0 || word == "elif" || word == "else";
      if (is_end) {
        Fail(node->pos, outer_end_tags.empty()
                            ? absl::StrCat("unexpected '{% ", word, " %}' with no open block")
                            : absl::StrCat("unexpected '{% ", word, " %}', expected '{% ",
                                           std::string(outer_end_tags.back()), " %}'"));
      }
      Fail(node->pos, absl::StrCat("unknown or unsupported tag '", word, "'"));
    }
    return node;
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> targets;
    bool paren = IsOp("(");
    if (paren) Next();
    targets.push_back(ExpectName());
    while (IsOp(",")) {
      Next();
      targets.push_back(ExpectName());
    }
    if (paren) ExpectOp(")");
    return targets;
  }

  ExprPtr Make(Expr::Type type, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->pos = pos;
    return e;
  }

  ExprPtr ParseTupleOrExpression() {
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

  ExprPtr ParseExpression(bool with_condexpr = true) {
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

  ExprPtr Binary(Expr::Type type, std::string op, ExprPtr lhs, ExprPtr rhs, SourcePos pos) {
    ExprPtr e = Make(type, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(lhs));
    e->args.push_back(std::move(rhs));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr lhs = ParseAnd();
    while (IsName("or")) {
      SourcePos pos = Next().pos;
      lhs = Binary(Expr::Type::kOr, "or", std::move(lhs), ParseAnd(), pos);
    }
    return lhs;
  }

  ExprPtr ParseAnd() {
    ExprPtr lhs = ParseNot();
    while (IsName("and")) {
      SourcePos pos = Next().pos;
      lhs = Binary(Expr::Type::kAnd, "and", std::move(lhs), ParseNot(), pos);
    }
    return lhs;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      ExprPtr e = Make(Expr::Type::kNot, Next().pos);
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
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
      } else if (IsName("not") && Peek().type == T::kName && Peek().text == "in") {
        Next();
        Next();
        op = "notin";
      } else {
        return lhs;
      }
      lhs = Binary(Expr::Type::kCompare, op, std::move(lhs), ParseMath1(), pos);
    }
  }

  ExprPtr ParseMath1() {
    ExprPtr lhs = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      SourcePos pos = Cur().pos;
      std::string op = Next().text;
      lhs = Binary(Expr::Type::kBinary, op, std::move(lhs), ParseConcat(), pos);
    }
    return lhs;
  }

  ExprPtr ParseConcat() {
    ExprPtr lhs = ParseMath2();
    while (IsOp("~")) {
      SourcePos pos = Next().pos;
      lhs = Binary(Expr::Type::kBinary, "~", std::move(lhs), ParseMath2(), pos);
    }
    return lhs;
  }

  ExprPtr ParseMath2() {
    ExprPtr lhs = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      SourcePos pos = Cur().pos;
      std::string op = Next().text;
      lhs = Binary(Expr::Type::kBinary, op, std::move(lhs), ParsePow(), pos);
    }
    return lhs;
  }

  ExprPtr ParsePow() {
    ExprPtr lhs = ParseUnary(true);
    while (IsOp("**")) {
      SourcePos pos = Next().pos;
      lhs = Binary(Expr::Type::kBinary, "**", std::move(lhs), ParseUnary(true), pos);
    }
    return lhs;
  }

  ExprPtr ParseUnary(bool with_filter) {
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

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    SourcePos pos = t.pos;
    switch (t.type) {
      case T::kName: {
        std::string name = Next().text;
        ExprPtr e = Make(Expr::Type::kLiteral, pos);
        if (name == "true" || name == "True") e->literal = Value(true);
        else if (name == "false" || name == "False") e->literal = Value(false);
        else if (name == "none" || name == "None") e->literal = Value::None();
        else {
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

  void ParseCallArgs(Expr* call) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (Cur().type == T::kName && Peek().type == T::kOperator && Peek().text == "=") {
        std::string key = Next().text;
        Next();
        call->kwargs.emplace_back(std::move(key), ParseExpression());
      } else {
        if (!call->kwargs.empty()) Fail("positional argument after keyword argument");
        call->args.push_back(ParseExpression());
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr ParsePostfix(ExprPtr node) {
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
        ExprPtr e = Make(is_slice ? Expr::Type::kSlice : Expr::Type::kGetItem, pos);
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

  ExprPtr ParseFilterExpr(ExprPtr node) {
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
        } else if ((Cur().type == T::kName || Cur().type == T::kString || Cur().type == T::kInt ||
                    Cur().type == T::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") &&
                   !IsName("in") && !IsName("not") && !IsName("is")) {
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

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  // Block statements being parsed (keyword, position), innermost last.
  std::vector<std::pair<std::string, SourcePos>> open_blocks_;
};

}  // namespace

absl::StatusOr<NodeList> ParseTemplate(const std::vector<Token>& tokens, std::string_view name) {
  try {
    Parser parser(tokens);
    return parser.ParseAll();
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name), ":", e.pos.line, ":", e.pos.column, ": ", e.what));
  }
}

}  // namespace tandem::chat
