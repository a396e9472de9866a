#pragma once

// Final-answer extraction and numeric equivalence for the math verifier.
//
// Extraction (ExtractFinalAnswer), first rule that applies wins:
//   1. the content of the last \boxed{...} (or \fbox{...}), braces nested to
//      any depth; an unterminated last \boxed is ignored;
//   2. the text after the last "answer is" or "answer:" (any case, so
//      "The final answer is", "**Answer:**"), up to the end of that line;
//   3. the last number in the text (see FindNumbers), e.g. "so we get 42."
//      gives "42".
//
// Numbers (ParseNumber) accept, after NormalizeAnswer:
//   integers and decimals ("12", "-3.50", ".5", "5."), thousands separators
//   in groups of three ("1,000", "12,345.6" but not "1,00"), fractions
//   "a/b", "\frac{a}{b}", "\dfrac", "\tfrac", "\frac12", a sign in front of
//   or inside a \frac, the Unicode minus sign, and surrounding "$", "\(",
//   "\[", "{}", and a "$" or "\$" currency sign. A trailing "%", "\%" or
//   "percent" is dropped ("50%" equals "50", not "0.5"); so are "^\circ" / "°"
//   and \text{...} units. Scientific notation, radicals and expressions are not
//   numbers; they are compared as normalized text.
//
// Equivalence is exact: a number is held as a reduced fraction of 128-bit
// integers (38 significant digits), so 0.33 != 1/3, 12 != 1.2, and
// 0.5 == 1/2 == \frac{2}{4} == 0.50. Only numbers that do not fit (more
// than ~38 digits) fall back to long double with a relative tolerance of
// 1e-15 (long double carries ~19 significant digits).

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::verifier {

// A number parsed from an answer.
struct AnswerNumber {
  // Exact value num/den in lowest terms with den > 0, when `exact`.
  bool exact = false;
  __int128 num = 0;
  __int128 den = 1;
  // Approximate value; always set.
  long double approx = 0.0L;
};

enum class AnswerSource { kBoxed, kAnswerPhrase, kLastNumber };

struct ExtractedAnswer {
  std::string text;
  AnswerSource source = AnswerSource::kLastNumber;
};

// Returns the final answer of `completion` per the rules above, or nullopt
// when there is none (no boxed answer, no answer phrase, no number).
std::optional<ExtractedAnswer> ExtractFinalAnswer(absl::string_view completion);

// The content of the last complete \boxed{...} or \fbox{...}, or nullopt.
std::optional<std::string> ExtractLastBoxed(absl::string_view text);

// Removes LaTeX and prose decoration that never changes a value: outer
// whitespace, "$" and "\$", "\(", "\)", "\[", "\]", "\left", "\right", "\!",
// "\,",
// "\;", "\displaystyle", outer braces, "{,}" (LaTeX thousands separator,
// becomes ","), a trailing "." (sentence end), percent and degree signs,
// and \text{...}/\mathrm{...}/\mbox{...} groups (unwrapped when they hold a
// digit, dropped as units otherwise). Inner spaces are kept, so "3 4" stays
// two numbers. \dfrac and \tfrac become \frac.
std::string NormalizeAnswer(absl::string_view text);

// Parses a whole (normalized) answer as a number; nullopt when any part of
// it is not. The caller normalizes; ParseNumber only trims whitespace.
std::optional<AnswerNumber> ParseNumber(absl::string_view text);

// All numeric tokens of free text, in order: "\frac{a}{b}" (and \dfrac,
// \tfrac), "a/b", and signed integers/decimals with optional thousands
// separators. Used for the last-number rule and to pick the first number
// out of an "answer is ..." line.
std::vector<std::string> FindNumbers(absl::string_view text);

// Exact comparison when both are exact, else relative tolerance 1e-15.
bool NumbersEqual(const AnswerNumber& a, const AnswerNumber& b);

// Formats a number for reasons: "3/4", "-2", or the long double value.
std::string FormatNumber(const AnswerNumber& number);

}  // namespace tandem::verifier
