#include "services/verifier/scoring/answer_parsing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace tandem::verifier {
namespace {

using Int128 = __int128;
using UInt128 = unsigned __int128;

constexpr Int128 kInt128Max = static_cast<Int128>(~UInt128{0} >> 1);

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

UInt128 Gcd(UInt128 a, UInt128 b) {
  while (b != 0) {
    UInt128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

UInt128 Abs(Int128 v) {
  return v < 0 ? UInt128{0} - static_cast<UInt128>(v) : static_cast<UInt128>(v);
}

// Brings num/den to lowest terms with den > 0. REQUIRES: den != 0.
void Reduce(AnswerNumber* n) {
  if (n->den < 0) {
    n->den = -n->den;
    n->num = -n->num;
  }
  const UInt128 g = Gcd(Abs(n->num), static_cast<UInt128>(n->den));
  if (g > 1) {
    n->num /= static_cast<Int128>(g);
    n->den /= static_cast<Int128>(g);
  }
}

AnswerNumber Inexact(long double value) {
  AnswerNumber n;
  n.exact = false;
  n.approx = value;
  return n;
}

std::optional<AnswerNumber> Divide(const AnswerNumber& a,
                                   const AnswerNumber& b) {
  if (b.exact ? b.num == 0 : b.approx == 0.0L) return std::nullopt;
  if (a.exact && b.exact) {
    // (a.num / a.den) / (b.num / b.den), cross-reduced first so that only
    // genuinely large results overflow.
    Int128 an = a.num, ad = a.den, bn = b.num, bd = b.den;
    const Int128 g1 = static_cast<Int128>(Gcd(Abs(an), Abs(bn)));
    const Int128 g2 = static_cast<Int128>(Gcd(Abs(ad), Abs(bd)));
    if (g1 > 1) an /= g1, bn /= g1;
    if (g2 > 1) ad /= g2, bd /= g2;
    AnswerNumber n;
    if (!__builtin_mul_overflow(an, bd, &n.num) &&
        !__builtin_mul_overflow(ad, bn, &n.den)) {
      n.exact = true;
      Reduce(&n);
      n.approx = static_cast<long double>(n.num) / n.den;
      return n;
    }
  }
  return Inexact(a.approx / b.approx);
}

// Parses an unsigned decimal at text[*pos] ("12", "1,000", "3.25", ".5",
// "5."), advancing *pos. Thousands groups must be exactly three digits.
std::optional<AnswerNumber> ParseUnsignedDecimal(absl::string_view text,
                                                 size_t* pos) {
  size_t i = *pos;
  std::string int_digits;
  while (i < text.size() && IsDigit(text[i])) int_digits += text[i++];
  if (!int_digits.empty() && int_digits.size() <= 3) {
    while (i + 3 < text.size() && text[i] == ',' && IsDigit(text[i + 1]) &&
           IsDigit(text[i + 2]) && IsDigit(text[i + 3]) &&
           (i + 4 >= text.size() || !IsDigit(text[i + 4]))) {
      absl::StrAppend(&int_digits, text.substr(i + 1, 3));
      i += 4;
    }
  }
  std::string frac_digits;
  if (i < text.size() && text[i] == '.' &&
      (!int_digits.empty() || (i + 1 < text.size() && IsDigit(text[i + 1])))) {
    ++i;
    while (i < text.size() && IsDigit(text[i])) frac_digits += text[i++];
  }
  if (int_digits.empty() && frac_digits.empty()) return std::nullopt;
  *pos = i;

  while (!frac_digits.empty() && frac_digits.back() == '0') {
    frac_digits.pop_back();
  }
  const std::string digits = int_digits + frac_digits;
  AnswerNumber n;
  n.exact = true;
  n.num = 0;
  n.den = 1;
  for (char c : digits) {
    if (n.num > (kInt128Max - 9) / 10) {
      n.exact = false;
      break;
    }
    n.num = n.num * 10 + (c - '0');
  }
  for (size_t k = 0; n.exact && k < frac_digits.size(); ++k) {
    if (n.den > kInt128Max / 10) {
      n.exact = false;
      break;
    }
    n.den *= 10;
  }
  const std::string plain =
      absl::StrCat(int_digits.empty() ? "0" : int_digits, ".",
                   frac_digits.empty() ? "0" : frac_digits);
  n.approx = std::strtold(plain.c_str(), nullptr);
  if (!n.exact) return Inexact(n.approx);
  Reduce(&n);
  return n;
}

size_t SkipSpaces(absl::string_view text, size_t pos) {
  while (pos < text.size() && absl::ascii_isspace(text[pos])) ++pos;
  return pos;
}

// Finds the '}' matching the '{' at text[open], looking no further than
// text[limit - 1]; npos when there is none. Escaped braces "\{" and "\}" do
// not count.
size_t MatchingBrace(absl::string_view text, size_t open,
                     size_t limit = absl::string_view::npos) {
  limit = std::min(limit, text.size());
  int depth = 0;
  for (size_t i = open; i < limit; ++i) {
    const char c = text[i];
    if (c == '\\') {
      ++i;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (--depth == 0) return i;
    }
  }
  return absl::string_view::npos;
}

// Length of a "\frac" / "\dfrac" / "\tfrac" command name at text[pos], 0 if
// there is none.
size_t FracCommandLength(absl::string_view text, size_t pos) {
  for (absl::string_view cmd : {"\\frac", "\\dfrac", "\\tfrac"}) {
    if (absl::StartsWith(text.substr(pos), cmd)) return cmd.size();
  }
  return 0;
}

// The argument of a \frac at text[*pos]: a braced group or one character.
// Groups longer than kMaxFracArgument are not numbers; the bound keeps
// scanning a completion full of "\frac{" linear.
std::optional<absl::string_view> FracArgument(absl::string_view text,
                                              size_t* pos) {
  constexpr size_t kMaxFracArgument = 256;
  size_t i = SkipSpaces(text, *pos);
  if (i >= text.size()) return std::nullopt;
  if (text[i] == '{') {
    const size_t close = MatchingBrace(text, i, i + kMaxFracArgument);
    if (close == absl::string_view::npos) return std::nullopt;
    *pos = close + 1;
    return text.substr(i + 1, close - i - 1);
  }
  if (!IsDigit(text[i])) return std::nullopt;
  *pos = i + 1;
  return text.substr(i, 1);
}

void Negate(AnswerNumber* n) {
  n->num = -n->num;
  n->approx = -n->approx;
}

std::optional<AnswerNumber> ParseNumberAtDepth(absl::string_view text,
                                               int depth);

// Parses "\frac{a}{b}" at text[*pos]. Nested fractions go at most
// kMaxFracDepth deep, which bounds the recursion whatever the input.
std::optional<AnswerNumber> ParseFrac(absl::string_view text, size_t* pos,
                                      int depth) {
  constexpr int kMaxFracDepth = 4;
  if (depth >= kMaxFracDepth) return std::nullopt;
  size_t i = *pos + FracCommandLength(text, *pos);
  std::optional<absl::string_view> top = FracArgument(text, &i);
  if (!top) return std::nullopt;
  std::optional<absl::string_view> bottom = FracArgument(text, &i);
  if (!bottom) return std::nullopt;
  std::optional<AnswerNumber> a = ParseNumberAtDepth(*top, depth + 1);
  std::optional<AnswerNumber> b = ParseNumberAtDepth(*bottom, depth + 1);
  if (!a || !b) return std::nullopt;
  *pos = i;
  return Divide(*a, *b);
}

std::optional<AnswerNumber> ParseNumberAtDepth(absl::string_view text,
                                               int depth) {
  text = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) {
    negative = text[i] == '-';
    i = SkipSpaces(text, i + 1);
  }
  std::optional<AnswerNumber> value;
  if (FracCommandLength(text, i) > 0) {
    value = ParseFrac(text, &i, depth);
  } else {
    value = ParseUnsignedDecimal(text, &i);
    if (value && i < text.size() && text[i] == '/') {
      size_t j = i + 1;
      std::optional<AnswerNumber> den = ParseUnsignedDecimal(text, &j);
      if (!den) return std::nullopt;
      value = Divide(*value, *den);
      i = j;
    }
  }
  if (!value || SkipSpaces(text, i) != text.size()) return std::nullopt;
  if (negative) Negate(&*value);
  return value;
}

// Removes \text{...}-style groups: unwrapped when they contain a digit,
// dropped (units such as "\text{ cm}") otherwise.
std::string StripTextGroups(absl::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t cmd_len = 0;
    for (absl::string_view cmd :
         {"\\text", "\\textbf", "\\mathrm", "\\mbox", "\\textrm"}) {
      if (absl::StartsWith(text.substr(i), cmd)) {
        const size_t after = i + cmd.size();
        if (after < text.size() && text[after] == '{') {
          cmd_len = std::max(cmd_len, cmd.size());
        }
      }
    }
    if (cmd_len == 0) {
      out += text[i++];
      continue;
    }
    const size_t open = i + cmd_len;
    const size_t close = MatchingBrace(text, open);
    if (close == absl::string_view::npos) {
      absl::StrAppend(&out, text.substr(i));
      break;
    }
    absl::string_view content = text.substr(open + 1, close - open - 1);
    bool has_digit = false;
    for (char c : content) has_digit |= IsDigit(c);
    if (has_digit) absl::StrAppend(&out, content);
    i = close + 1;
  }
  return out;
}

// Strips one layer of decoration from either end; returns whether it did.
bool StripOuterDecoration(std::string* s) {
  const std::string before = *s;
  absl::string_view v = absl::StripAsciiWhitespace(*s);
  for (absl::string_view suffix : {"percent", "%", ".", "$", "\\)", "\\]"}) {
    if (absl::ConsumeSuffix(&v, suffix)) break;
  }
  for (absl::string_view prefix : {"$", "\\(", "\\["}) {
    if (absl::ConsumePrefix(&v, prefix)) break;
  }
  v = absl::StripAsciiWhitespace(v);
  if (v.size() >= 2 && v.front() == '{' &&
      MatchingBrace(v, 0) == v.size() - 1) {
    v = v.substr(1, v.size() - 2);
  }
  *s = std::string(v);
  return *s != before;
}

void AppendNumberToken(absl::string_view text, size_t start, size_t end,
                       std::vector<std::string>* out) {
  out->emplace_back(text.substr(start, end - start));
}

}  // namespace

std::optional<std::string> ExtractLastBoxed(absl::string_view text) {
  constexpr absl::string_view kCommands[] = {"\\boxed", "\\fbox"};
  constexpr size_t npos = absl::string_view::npos;
  size_t next[2] = {text.rfind(kCommands[0]), text.rfind(kCommands[1])};
  // A group left open at position p leaves every earlier group that is
  // still open at p unterminated too, so the brace scan of earlier
  // candidates stops at p. This keeps the search linear in the text.
  size_t scan_limit = text.size();
  while (next[0] != npos || next[1] != npos) {
    const int k =
        next[1] == npos || (next[0] != npos && next[0] > next[1]) ? 0 : 1;
    const size_t at = next[k];
    const size_t command_end = at + kCommands[k].size();
    next[k] = at == 0 ? npos : text.rfind(kCommands[k], at - 1);
    const size_t i = SkipSpaces(text, command_end);
    if (i < text.size() && text[i] == '{') {
      const size_t close = MatchingBrace(text, i, scan_limit);
      if (close != npos) return std::string(text.substr(i + 1, close - i - 1));
      scan_limit = at;
    } else if (i > command_end && i < text.size()) {
      // "\boxed 5": the token up to the next space or '$'.
      size_t end = i;
      while (end < text.size() && !absl::ascii_isspace(text[end]) &&
             text[end] != '$') {
        ++end;
      }
      return std::string(text.substr(i, end - i));
    }
  }
  return std::nullopt;
}

std::string NormalizeAnswer(absl::string_view text) {
  std::string s =
      absl::StrReplaceAll(text, {{"\xE2\x88\x92", "-"},  // U+2212 MINUS SIGN
                                 {"\\left", ""},
                                 {"\\right", ""},
                                 {"\\displaystyle", ""},
                                 {"\\!", ""},
                                 {"\\,", ""},
                                 {"\\;", ""},
                                 {"\\:", ""},
                                 {"{,}", ","},
                                 {"\\dfrac", "\\frac"},
                                 {"\\tfrac", "\\frac"},
                                 {"\\%", "%"},
                                 {"\\$", "$"},
                                 {"^{\\circ}", ""},
                                 {"^\\circ", ""},
                                 {"\xC2\xB0", ""}});  // U+00B0 DEGREE SIGN
  s = StripTextGroups(s);
  // Each pass removes one layer; real answers have a few.
  for (int pass = 0; pass < 16 && StripOuterDecoration(&s); ++pass) {
  }
  return s;
}

std::optional<AnswerNumber> ParseNumber(absl::string_view text) {
  return ParseNumberAtDepth(text, 0);
}

std::vector<std::string> FindNumbers(absl::string_view text) {
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    size_t body = i;
    if (text[i] == '-' && (i == 0 || !absl::ascii_isalnum(text[i - 1]))) {
      body = i + 1;
    }
    if (FracCommandLength(text, body) > 0) {
      size_t end = body;
      if (ParseFrac(text, &end, 0)) {
        AppendNumberToken(text, start, end, &tokens);
        i = end;
        continue;
      }
      i = body + FracCommandLength(text, body);
      continue;
    }
    const bool starts_number =
        body < text.size() &&
        (IsDigit(text[body]) || (text[body] == '.' && body + 1 < text.size() &&
                                 IsDigit(text[body + 1])));
    // A digit right after a letter or digit belongs to a word ("x2", "3D").
    if (!starts_number ||
        (body == i && i > 0 && absl::ascii_isalnum(text[i - 1]))) {
      ++i;
      continue;
    }
    size_t end = body;
    if (!ParseUnsignedDecimal(text, &end)) {
      ++i;
      continue;
    }
    if (end + 1 < text.size() && text[end] == '/' && IsDigit(text[end + 1])) {
      size_t den_end = end + 1;
      if (ParseUnsignedDecimal(text, &den_end)) end = den_end;
    }
    AppendNumberToken(text, start, end, &tokens);
    i = end;
  }
  return tokens;
}

std::optional<ExtractedAnswer> ExtractFinalAnswer(
    absl::string_view completion) {
  if (std::optional<std::string> boxed = ExtractLastBoxed(completion)) {
    return ExtractedAnswer{*std::move(boxed), AnswerSource::kBoxed};
  }

  const std::string lower = absl::AsciiStrToLower(completion);
  size_t phrase_end = absl::string_view::npos;
  for (absl::string_view phrase : {"answer is", "answer:"}) {
    const size_t found = absl::string_view(lower).rfind(phrase);
    if (found != std::string::npos && (phrase_end == absl::string_view::npos ||
                                       found + phrase.size() > phrase_end)) {
      phrase_end = found + phrase.size();
    }
  }
  if (phrase_end != absl::string_view::npos) {
    absl::string_view rest = completion.substr(phrase_end);
    // The answer is on the rest of the line, or on the next non-empty line
    // when the phrase ends its line ("Answer:\n42").
    while (!rest.empty()) {
      const size_t newline = rest.find('\n');
      absl::string_view line = rest.substr(0, newline);
      line = absl::StripAsciiWhitespace(line);
      while (!line.empty() && (line.front() == ':' || line.front() == '*' ||
                               absl::ascii_isspace(line.front()))) {
        line.remove_prefix(1);
      }
      while (!line.empty() && (line.back() == '*' || line.back() == '.' ||
                               absl::ascii_isspace(line.back()))) {
        line.remove_suffix(1);
      }
      if (!line.empty()) {
        if (ParseNumber(NormalizeAnswer(line))) {
          return ExtractedAnswer{std::string(line),
                                 AnswerSource::kAnswerPhrase};
        }
        std::vector<std::string> numbers = FindNumbers(line);
        return ExtractedAnswer{
            numbers.empty() ? std::string(line) : std::move(numbers.front()),
            AnswerSource::kAnswerPhrase};
      }
      if (newline == absl::string_view::npos) break;
      rest.remove_prefix(newline + 1);
    }
  }

  std::vector<std::string> numbers = FindNumbers(completion);
  if (numbers.empty()) return std::nullopt;
  return ExtractedAnswer{std::move(numbers.back()), AnswerSource::kLastNumber};
}

bool NumbersEqual(const AnswerNumber& a, const AnswerNumber& b) {
  if (a.exact && b.exact) return a.num == b.num && a.den == b.den;
  const long double scale =
      std::max({std::fabs(a.approx), std::fabs(b.approx), 1e-300L});
  return std::fabs(a.approx - b.approx) <= 1e-15L * scale;
}

std::string FormatNumber(const AnswerNumber& number) {
  if (!number.exact) {
    return absl::StrFormat("%.18Lg", number.approx);
  }
  auto to_string = [](Int128 v) {
    const bool negative = v < 0;
    UInt128 u = Abs(v);
    std::string digits;
    do {
      digits.insert(digits.begin(), static_cast<char>('0' + u % 10));
      u /= 10;
    } while (u != 0);
    return negative ? "-" + digits : digits;
  };
  if (number.den == 1) return to_string(number.num);
  return absl::StrCat(to_string(number.num), "/", to_string(number.den));
}

}  // namespace tandem::verifier
