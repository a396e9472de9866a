#include "common/chat/jinja_parser.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_expression_parser.h"

namespace tandem::chat {
namespace {

using jinja_internal::ParseError;

// The statement grammar (text, {{ }} output, {% %} tags) over the
// expression grammar it extends.
class Parser : public jinja_internal::ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  NodeList ParseAll() {
    NodeList nodes = ParseBody({});
    if (Cur().type != Token::Type::kEnd) Fail("unexpected tag");
    return nodes;
  }

 private:
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
