#include "common/chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tandem::chat {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  Lexer(std::string_view source, std::string_view name) : src_(source), name_(name) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;  // The text chunk begins at a line start.
    bool strip_next = false;    // The previous tag ended with `-`.
    while (pos <= src_.size()) {
      size_t tag = FindTagStart(pos);
      std::string text(src_.substr(pos, (tag == std::string_view::npos ? src_.size() : tag) - pos));
      if (strip_next) {
        size_t i = 0;
        while (i < text.size() && IsSpace(text[i])) ++i;
        text.erase(0, i);
        strip_next = false;
      }
      if (tag == std::string_view::npos) {
        // keep_trailing_newline=False: one final newline is dropped.
        if (!text.empty() && text.back() == '\n') {
          text.pop_back();
          if (!text.empty() && text.back() == '\r') text.pop_back();
        }
        EmitText(std::move(text), pos);
        break;
      }
      char kind = src_[tag + 1];
      char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (modifier != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between a line start and a
        // block or comment tag.
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) blank = blank && IsSpace(text[i]);
          if (blank) text.erase(l_pos);
        }
      }
      EmitText(std::move(text), pos);
      size_t inner = tag + 2 + ((modifier == '-' || (modifier == '+' && kind == '%')) ? 1 : 0);
      size_t end = 0;
      bool strip_after = false;
      if (kind == '#') {
        size_t close = src_.find("#}", inner);
        if (close == std::string_view::npos) return Error(tag, "unclosed comment");
        strip_after = close > inner && src_[close - 1] == '-';
        end = close + 2;
        if (!strip_after) end = TrimNewline(end);
      } else {
        auto result = LexTag(tag, inner, kind == '{');
        if (!result.ok()) return result.status();
        end = *result;
        strip_after = src_[end - 3] == '-';
        if (kind == '%' && !strip_after) end = TrimNewline(end);
      }
      strip_next = strip_after;
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos = end;
    }
    Token eof{Token::Type::kEnd};
    eof.pos = Pos(src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    size_t i = src_.find('{', from);
    while (i != std::string_view::npos && i + 1 < src_.size()) {
      char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
      i = src_.find('{', i + 1);
    }
    return std::string_view::npos;
  }

  size_t TrimNewline(size_t end) const {
    if (end < src_.size() && src_[end] == '\n') return end + 1;
    if (end + 1 < src_.size() && src_[end] == '\r' && src_[end + 1] == '\n') return end + 2;
    return end;
  }

  SourcePos Pos(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return SourcePos{static_cast<int>(line),
                     static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  absl::Status Error(size_t offset, std::string_view what) const {
    SourcePos p = Pos(offset);
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name_), ":", p.line, ":", p.column, ": ", std::string(what)));
  }

  void EmitText(std::string text, size_t offset) {
    if (text.empty()) return;
    Token t{Token::Type::kText, std::move(text)};
    t.pos = Pos(offset);
    tokens_.push_back(std::move(t));
  }

  void Emit(Token::Type type, std::string text, size_t offset) {
    Token t{type, std::move(text)};
    t.pos = Pos(offset);
    tokens_.push_back(std::move(t));
  }

  // Lexes the inside of `{{ ... }}` or `{% ... %}` from `i`; returns the
  // offset just past the closing delimiter.
  absl::StatusOr<size_t> LexTag(size_t tag, size_t i, bool variable) {
    Emit(variable ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", tag);
    const char close = variable ? '}' : '%';
    std::string open;  // Unclosed brackets, innermost last.
    while (true) {
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (i >= src_.size()) {
        std::string what = variable ? "unclosed '{{' (missing '}}')" : "unclosed '{%' (missing '%}')";
        if (!open.empty()) absl::StrAppend(&what, "; '", open.substr(open.size() - 1), "' still open inside it");
        return Error(tag, what);
      }
      if (open.empty()) {
        size_t j = i;
        if (src_[j] == '-' || (src_[j] == '+' && !variable)) ++j;
        if (j + 1 < src_.size() && src_[j] == close && src_[j + 1] == '}' &&
            (j == i || src_[i] == '-' || src_[i] == '+')) {
          Emit(variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", i);
          return j + 2;
        }
      }
      char c = src_[i];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        Emit(Token::Type::kName, std::string(src_.substr(i, j - i)), i);
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        auto result = LexNumber(i);
        if (!result.ok()) return result.status();
        i = *result;
      } else if (c == '\'' || c == '"') {
        auto result = LexString(i);
        if (!result.ok()) return result.status();
        i = *result;
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string_view op;
        for (std::string_view two : kTwo) {
          if (src_.substr(i, 2) == two) op = two;
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~<>()[]{},.:|=").find(c) == std::string_view::npos) {
            return Error(i, absl::StrCat("unexpected character '", std::string(1, c), "'"));
          }
          op = src_.substr(i, 1);
        }
        if (op == "(" || op == "[" || op == "{") open += op[0];
        char closer_of = op == ")" ? '(' : op == "]" ? '[' : op == "}" ? '{' : '\0';
        if (closer_of != '\0' && !open.empty() && open.back() == closer_of) open.pop_back();
        Emit(Token::Type::kOperator, std::string(op), i);
        i += op.size();
      }
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t i) {
    size_t j = i;
    bool is_float = false;
    auto digits = [&] {
      while (j < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
    };
    digits();
    if (j + 1 < src_.size() && src_[j] == '.' && std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
      is_float = true;
      ++j;
      digits();
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        j = k;
        digits();
      }
    }
    std::string text;
    for (size_t k = i; k < j; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    Token t{is_float ? Token::Type::kFloat : Token::Type::kInt, text};
    t.pos = Pos(i);
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (ec != std::errc()) return Error(i, absl::StrCat("integer literal out of range: ", text));
    }
    tokens_.push_back(std::move(t));
    return j;
  }

  absl::StatusOr<size_t> LexString(size_t i) {
    char quote = src_[i];
    std::string out;
    size_t j = i + 1;
    while (true) {
      if (j >= src_.size()) return Error(i, "unclosed string literal");
      char c = src_[j];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++j;
        continue;
      }
      if (j + 1 >= src_.size()) return Error(i, "unclosed string literal");
      char e = src_[j + 1];
      j += 2;
      auto hex = [&](int n) -> int64_t {
        if (j + n > src_.size()) return -1;
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          char h = src_[j + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return -1;
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        j += n;
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          int64_t cp = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (cp < 0 || cp > 0x10FFFF) return Error(j, "bad escape in string literal");
          AppendUtf8(static_cast<uint32_t>(cp), &out);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    Emit(Token::Type::kString, std::move(out), i);
    return j + 1;
  }

  std::string_view src_;
  std::string_view name_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source, std::string_view name) {
  // jinja2 normalises every newline (\r\n, \r) in the template to \n.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  return Lexer(normalized, name).Run();
}

}  // namespace tandem::chat
