#pragma once

// Internal to the chat-template parser (jinja_parser.cc and
// jinja_expression_parser.cc): the position in the lexed tokens, the checks
// and error messages both grammars share, and the nesting bound
// (kMaxParseDepth) that keeps hostile input from exhausting the stack.
// Errors are thrown as ParseError and turned into a Status by
// ParseTemplate, the only entry point.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_lexer.h"
#include "common/chat/jinja_parser.h"

namespace tandem::chat::jinja_internal {

// Thrown inside the parser only; ParseTemplate turns it into a Status.
struct ParseError {
  SourcePos pos;
  std::string what;
};

class TokenCursor {
 public:
  explicit TokenCursor(const std::vector<Token>& tokens) : tokens_(tokens) {}

 protected:
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
  [[noreturn]] void Fail(std::string what) const {
    throw ParseError{Cur().pos, std::move(what)};
  }
  [[noreturn]] void Fail(SourcePos pos, std::string what) const {
    throw ParseError{pos, std::move(what)};
  }

  bool IsOp(std::string_view op) const {
    return Cur().type == T::kOperator && Cur().text == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == T::kName && Cur().text == name;
  }
  void ExpectOp(std::string_view op) {
    if (!IsOp(op)) {
      Fail(absl::StrCat("expected '", std::string(op), "', got ",
                        Describe(Cur())));
    }
    Next();
  }
  std::string ExpectName() {
    if (Cur().type != T::kName) {
      Fail(absl::StrCat("expected a name, got ", Describe(Cur())));
    }
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) {
      Fail(absl::StrCat("expected '%}', got ", Describe(Cur())));
    }
    Next();
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kEnd:
        return "end of template";
      case T::kText:
        return "text";
      case T::kVarBegin:
        return "'{{'";
      case T::kVarEnd:
        return "'}}'";
      case T::kBlockBegin:
        return "'{%'";
      case T::kBlockEnd:
        return "'%}'";
      case T::kString:
        return "a string";
      case T::kInt:
      case T::kFloat:
        return absl::StrCat("number ", t.text);
      default:
        return absl::StrCat("'", t.text, "'");
    }
  }

  struct DepthGuard {
    explicit DepthGuard(TokenCursor* p) : p(p) {
      if (++p->depth_ > kMaxParseDepth) p->Fail("template nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
    TokenCursor* p;
  };

 private:
  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace tandem::chat::jinja_internal
