// Unit tests of the verifier's scorers that run no programs: math answer
// extraction and equivalence, exact, regex, arith, and the registry.

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "services/verifier/scoring/answer_parsing.h"
#include "services/verifier/scoring/arith_scorer.h"
#include "services/verifier/scoring/exact_scorer.h"
#include "services/verifier/scoring/math_scorer.h"
#include "services/verifier/scoring/regex_scorer.h"
#include "services/verifier/scoring/scorer_registry.h"

namespace tandem::verifier {
namespace {

ScoreRequest Request(std::string completion,
                     std::map<std::string, std::string> metadata) {
  ScoreRequest request;
  request.completion_text = std::move(completion);
  request.prompt_text = "prompt";
  request.metadata = std::move(metadata);
  return request;
}

bool IsKnownOutcome(const std::string& outcome) {
  for (absl::string_view known : kAllOutcomes) {
    if (outcome == known) return true;
  }
  return false;
}

struct MathCase {
  const char* completion;
  const char* answer;
  bool equal;
};

TEST_CASE("math accepts equivalent answers and rejects non-equivalent ones",
          "[math]") {
  const std::vector<MathCase> cases = {
      // Integers and signs.
      {"\\boxed{42}", "42", true},
      {"\\boxed{-7}", "-7", true},
      {"\\boxed{7}", "-7", false},
      {"\\boxed{+7}", "7", true},
      {"\\boxed{\xE2\x88\x92"
       "7}",
       "-7", true},  // Unicode minus.
      {"\\boxed{042}", "42", true},
      // Decimals and trailing zeros.
      {"\\boxed{5.0}", "5", true},
      {"\\boxed{5.}", "5", true},
      {"\\boxed{2.50}", "2.5", true},
      {"\\boxed{.5}", "0.5", true},
      {"\\boxed{12}", "1.2", false},
      {"\\boxed{1.2}", "12", false},
      {"\\boxed{0.1}", "0.01", false},
      {"\\boxed{3.14}", "3.14159", false},
      {"\\boxed{0.30000000000000004}", "0.3", false},
      // Fractions.
      {"\\boxed{1/2}", "0.5", true},
      {"\\boxed{\\frac{1}{2}}", "0.5", true},
      {"\\boxed{\\dfrac{3}{4}}", "3/4", true},
      {"\\boxed{\\tfrac{6}{8}}", "0.75", true},
      {"\\boxed{\\frac12}", "1/2", true},
      {"\\boxed{-\\frac{1}{2}}", "-0.5", true},
      {"\\boxed{\\frac{-1}{2}}", "-1/2", true},
      {"\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", true},
      {"\\boxed{0.33}", "1/3", false},
      {"\\boxed{0.333333}", "\\frac{1}{3}", false},
      {"\\boxed{1/3}", "2/3", false},
      {"\\boxed{\\frac{1}{2}}", "-\\frac{1}{2}", false},
      {"\\boxed{\\frac{10}{4}}", "2.5", true},
      {"\\boxed{\\frac{1}{0}}", "1", false},
      // Thousands separators.
      {"\\boxed{1,000}", "1000", true},
      {"\\boxed{1{,}000}", "1000", true},
      {"\\boxed{12,345.5}", "12345.5", true},
      {"\\boxed{1,000,000}", "1000000", true},
      {"\\boxed{1,00}", "100", false},
      {"\\boxed{1,000}", "1", false},
      // Percent, dollars, degrees, units.
      {"\\boxed{50\\%}", "50", true},
      {"\\boxed{50%}", "50", true},
      {"\\boxed{50}", "50\\%", true},
      {"\\boxed{50\\%}", "0.5", false},
      {"$\\boxed{3}$", "$3$", true},
      {"\\boxed{\\$5}", "5", true},
      {"\\boxed{90^\\circ}", "90", true},
      {"\\boxed{12 \\text{ cm}}", "12", true},
      {"\\boxed{\\text{12}}", "12", true},
      {"\\boxed{x = 5}", "5", true},
      {"\\boxed{5 or 6}", "5", false},
      // Other extraction rules.
      {"So the answer is 17.", "17", true},
      {"The final answer is $\\frac{3}{4}$.", "0.75", true},
      {"**Answer:** 1,234", "1234", true},
      {"Answer:\n\n  -3\n", "-3", true},
      {"The answer is 12 apples, not 13", "12", true},
      {"We add 2 and 3 to get 5.", "5", true},
      {"We add 2 and 3 to get 5.", "3", false},
      {"First 3/4 then 7/8", "7/8", true},
      {"a fraction: \\frac{5}{10}", "1/2", true},
      {"x2 equals -4", "-4", true},
      {"The answer is 7. Wait, \\boxed{8}", "8", true},
      {"The answer is 7. Wait, \\boxed{8}", "7", false},
      // Non-numeric answers compare as normalized text.
      {"\\boxed{x+1}", "x + 1", true},
      {"\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", true},
      {"\\boxed{(1,2)}", "(1, 2)", true},
      {"\\boxed{\\left(1,2\\right)}", "(1,2)", true},
      {"\\boxed{(1,3)}", "(1,2)", false},
      {"The answer is \\%", ".", false},  // Both normalize to nothing.
  };
  auto scorer = NewMathScorer();
  for (const MathCase& c : cases) {
    INFO("completion: " << c.completion << "  answer: " << c.answer);
    const ScoreRequest request = Request(c.completion, {{"answer", c.answer}});
    REQUIRE(scorer->Validate(request).ok());
    const ScoreResult result = scorer->Score(request);
    INFO("outcome: " << result.outcome << "  reason: " << result.reason);
    CHECK(result.reward == (c.equal ? 1.0 : 0.0));
    CHECK(result.outcome == (c.equal ? "correct" : "incorrect"));
  }
}

TEST_CASE("math extracts the last boxed answer with nested braces", "[math]") {
  CHECK(ExtractLastBoxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") ==
        "\\frac{1}{2}");
  CHECK(ExtractLastBoxed("\\boxed{\\frac{\\sqrt{\\frac{1}{2}}}{2}}") ==
        "\\frac{\\sqrt{\\frac{1}{2}}}{2}");
  CHECK(ExtractLastBoxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}");
  CHECK(ExtractLastBoxed("\\fbox{9}") == "9");
  CHECK(ExtractLastBoxed("\\boxed 5$") == "5");
  // An unterminated last \boxed falls back to the previous complete one.
  CHECK(ExtractLastBoxed("\\boxed{3} and \\boxed{4") == "3");
  CHECK_FALSE(ExtractLastBoxed("no box here").has_value());
  CHECK_FALSE(ExtractLastBoxed("\\boxed{never closed").has_value());
}

TEST_CASE("math parses numbers exactly", "[math]") {
  auto third = ParseNumber("1/3");
  REQUIRE(third.has_value());
  CHECK(third->exact);
  CHECK(FormatNumber(*third) == "1/3");
  auto big = ParseNumber("123456789012345678901234567890");
  REQUIRE(big.has_value());
  CHECK(big->exact);
  CHECK_FALSE(
      NumbersEqual(*big, *ParseNumber("123456789012345678901234567891")));
  // Beyond 128 bits the comparison is approximate but still tight.
  auto huge = ParseNumber("1" + std::string(45, '0'));
  REQUIRE(huge.has_value());
  CHECK_FALSE(huge->exact);
  CHECK(NumbersEqual(*huge, *ParseNumber("1" + std::string(45, '0'))));
  CHECK_FALSE(NumbersEqual(*huge, *ParseNumber("2" + std::string(45, '0'))));
  CHECK_FALSE(ParseNumber("3 4").has_value());
  CHECK_FALSE(ParseNumber("1e5").has_value());
  CHECK_FALSE(ParseNumber("abc").has_value());
  CHECK_FALSE(ParseNumber("").has_value());
}

TEST_CASE("math handles degenerate completions in bounded time", "[math]") {
  auto scorer = NewMathScorer();
  // Repetition loops of the kind RL policies produce; each would be
  // quadratic (or overflow the stack) with a naive brace matcher.
  std::string open_boxes, open_fracs, nested_fracs, nested_braces;
  for (int i = 0; i < 50000; ++i) {
    open_boxes += "\\boxed{";
    open_fracs += "\\frac{";
  }
  for (int i = 0; i < 20000; ++i) nested_fracs += "\\frac{";
  nested_fracs += "1";
  for (int i = 0; i < 20000; ++i) nested_fracs += "}{2}";
  nested_braces = "\\boxed{" + std::string(100000, '{') + "7" +
                  std::string(100000, '}') + "}";
  const auto start = std::chrono::steady_clock::now();
  CHECK(scorer->Score(Request(open_boxes + " 5", {{"answer", "5"}})).reward ==
        1.0);
  CHECK(scorer->Score(Request(open_fracs, {{"answer", "5"}})).reward == 0.0);
  CHECK(
      scorer->Score(Request("\\boxed{" + nested_fracs + "}", {{"answer", "5"}}))
          .reward == 0.0);
  // Only a few layers of braces are unwrapped; this many is no number.
  CHECK(scorer->Score(Request(nested_braces, {{"answer", "7"}})).reward == 0.0);
  CHECK(scorer->Score(Request("\\boxed{{{7}}}", {{"answer", "7"}})).reward ==
        1.0);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("math reports no_answer and validates the answer field", "[math]") {
  auto scorer = NewMathScorer();
  const ScoreResult none =
      scorer->Score(Request("I do not know.", {{"answer", "3"}}));
  CHECK(none.outcome == "no_answer");
  CHECK(none.reward == 0.0);

  const absl::Status missing = scorer->Validate(Request("\\boxed{3}", {}));
  CHECK(absl::IsInvalidArgument(missing));
  CHECK(absl::StrContains(missing.message(), "answer"));
  CHECK(absl::IsInvalidArgument(
      scorer->Validate(Request("\\boxed{3}", {{"answer", "  "}}))));
  // Score on an invalid request degrades to outcome "error".
  const ScoreResult invalid = scorer->Score(Request("\\boxed{3}", {}));
  CHECK(invalid.outcome == "error");
  CHECK(invalid.reward == 0.0);
}

TEST_CASE("exact compares trimmed text, optionally ignoring case", "[exact]") {
  auto scorer = NewExactScorer();
  CHECK(scorer->Score(Request("  Paris\n", {{"answer", "Paris"}})).reward ==
        1.0);
  CHECK(scorer->Score(Request("paris", {{"answer", "Paris"}})).reward == 0.0);
  CHECK(scorer
            ->Score(Request("paris",
                            {{"answer", "Paris"}, {"case_sensitive", "false"}}))
            .reward == 1.0);
  CHECK(scorer->Score(Request("Par is", {{"answer", "Paris"}})).outcome ==
        "incorrect");
  CHECK(scorer->Score(Request(" \n", {{"answer", "Paris"}})).outcome ==
        "no_answer");
  CHECK(absl::IsInvalidArgument(scorer->Validate(Request("x", {}))));
  const absl::Status bad_option = scorer->Validate(
      Request("x", {{"answer", "x"}, {"case_sensitive", "maybe"}}));
  CHECK(absl::IsInvalidArgument(bad_option));
  CHECK(absl::StrContains(bad_option.message(), "case_sensitive"));
}

TEST_CASE("regex full-matches or searches per metadata", "[regex]") {
  auto scorer = NewRegexScorer();
  const auto score = [&](std::string completion,
                         std::map<std::string, std::string> metadata) {
    const ScoreRequest request = Request(std::move(completion), metadata);
    REQUIRE(scorer->Validate(request).ok());
    return scorer->Score(request);
  };
  CHECK(score("ab123\n", {{"pattern", "[a-z]+\\d+"}}).reward == 1.0);
  CHECK(score("xx ab123", {{"pattern", "[a-z]+\\d+"}}).reward == 0.0);
  CHECK(score("xx ab123 yy", {{"pattern", "[a-z]+\\d+"}, {"match", "search"}})
            .reward == 1.0);
  CHECK(score("a", {{"pattern", "a|ab"}, {"match", "full"}}).reward == 1.0);
  CHECK(score("ab", {{"pattern", "a|ab"}, {"match", "full"}}).reward == 1.0);
  CHECK(score("YES", {{"pattern", "yes"}}).outcome == "incorrect");
  CHECK(
      score("YES", {{"pattern", "yes"}, {"case_sensitive", "false"}}).outcome ==
      "correct");
  CHECK(score("caf\xC3\xA9", {{"pattern", "caf."}}).reward == 1.0);
  CHECK(score("bad \xFF utf8 ok", {{"pattern", "ok"}, {"match", "search"}})
            .reward == 1.0);
}

TEST_CASE("regex rejects a bad pattern as InvalidArgument", "[regex]") {
  auto scorer = NewRegexScorer();
  const absl::Status bad =
      scorer->Validate(Request("x", {{"pattern", "(unclosed"}}));
  CHECK(absl::IsInvalidArgument(bad));
  CHECK(absl::StrContains(bad.message(), "metadata.pattern"));
  CHECK(absl::IsInvalidArgument(scorer->Validate(Request("x", {}))));
  CHECK(absl::IsInvalidArgument(
      scorer->Validate(Request("x", {{"pattern", "x"}, {"match", "half"}}))));
  CHECK(scorer->Score(Request("x", {{"pattern", "(unclosed"}})).outcome ==
        "error");
}

TEST_CASE("regex bounds catastrophic backtracking", "[regex]") {
  auto scorer = NewRegexScorer();
  const ScoreResult result =
      scorer->Score(Request(std::string(40, 'a') + "!",
                            {{"pattern", "(a+)+$"}, {"match", "search"}}));
  CHECK(result.reward == 0.0);
  CHECK(IsKnownOutcome(result.outcome));
}

TEST_CASE("arith reads one integer up to the first newline or end marker",
          "[arith]") {
  auto scorer = NewArithScorer();
  const auto score = [&](std::string completion, std::string answer) {
    const ScoreRequest request =
        Request(std::move(completion), {{"answer", std::move(answer)}});
    REQUIRE(scorer->Validate(request).ok());
    return scorer->Score(request);
  };
  CHECK(score("42", "42").reward == 1.0);
  CHECK(score("-17", "-17").reward == 1.0);
  CHECK(score("42\n", "42").reward == 1.0);
  CHECK(score("42\n43 ignored", "42").reward == 1.0);
  CHECK(score("42</s>garbage", "42").reward == 1.0);
  CHECK(score("42<|endoftext|>", "42").reward == 1.0);
  CHECK(score(" 42 \r\n", "42").reward == 1.0);
  CHECK(score("0042", "42").reward == 1.0);
  CHECK(score("-0", "0").reward == 1.0);
  CHECK(
      score("123456789012345678901234567890", "123456789012345678901234567890")
          .reward == 1.0);
  CHECK(score("43", "42").outcome == "incorrect");
  CHECK(score("-42", "42").outcome == "incorrect");
  CHECK(score("4 2", "42").outcome == "no_answer");
  CHECK(score("+42", "42").outcome == "no_answer");
  CHECK(score("42.0", "42").outcome == "no_answer");
  CHECK(score("1,000", "1000").outcome == "no_answer");
  CHECK(score("\n42", "42").outcome == "no_answer");
  CHECK(score("", "42").outcome == "no_answer");
  CHECK(score("-", "42").outcome == "no_answer");
  CHECK(scorer
            ->Score(Request("42<END>x",
                            {{"answer", "42"}, {"end_marker", "<END>"}}))
            .reward == 1.0);
  const absl::Status bad = scorer->Validate(Request("1", {{"answer", "x"}}));
  CHECK(absl::IsInvalidArgument(bad));
  CHECK(absl::StrContains(bad.message(), "metadata.answer"));
}

TEST_CASE("registry creates built-in scorers and lists known names",
          "[registry]") {
  ScorerRegistry registry;
  REQUIRE(RegisterBuiltinScorers(BuiltinScorerConfig{}, &registry).ok());
  CHECK(registry.Names() ==
        std::vector<std::string>{"arith", "code", "exact", "math", "regex"});
  for (const std::string& name : registry.Names()) {
    auto scorer = registry.Create(name);
    INFO(name << ": " << scorer.status());
    CHECK(scorer.ok());
  }
  auto unknown = registry.Create("chess");
  CHECK(absl::IsNotFound(unknown.status()));
  CHECK(absl::StrContains(unknown.status().message(), "chess"));
  CHECK(absl::StrContains(unknown.status().message(),
                          "arith, code, exact, math, regex"));
  CHECK(absl::IsAlreadyExists(
      registry.Register("math", [] { return NewMathScorer(); })));
  CHECK(absl::IsAlreadyExists(
      RegisterBuiltinScorers(BuiltinScorerConfig{}, &registry)));
}

TEST_CASE("registry adds a verifier with one registration", "[registry]") {
  ScorerRegistry registry;
  REQUIRE(registry.Register("exact2", [] { return NewExactScorer(); }).ok());
  auto scorer = registry.Create("exact2");
  REQUIRE(scorer.ok());
  CHECK((*scorer)->Score(Request("a", {{"answer", "a"}})).reward == 1.0);
  CHECK(absl::IsInvalidArgument(registry.Register("", nullptr)));
  CHECK(absl::IsInvalidArgument(registry.Register("null", nullptr)));
}

TEST_CASE("registry surfaces a bad code sandbox config on Create",
          "[registry]") {
  ScorerRegistry registry;
  BuiltinScorerConfig config;
  config.sandbox.limits.cpu_seconds = 0;
  REQUIRE(RegisterBuiltinScorers(config, &registry).ok());
  auto code = registry.Create("code");
  CHECK(absl::IsInvalidArgument(code.status()));
  CHECK(absl::StrContains(code.status().message(), "cpu_seconds"));
}

TEST_CASE("scorers are safe to call concurrently", "[concurrency]") {
  auto math = NewMathScorer();
  auto regex = NewRegexScorer();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string n = std::to_string(t * 1000 + i);
        if (math->Score(Request("\\boxed{" + n + "}", {{"answer", n}}))
                .reward != 1.0) {
          ++wrong;
        }
        if (regex->Score(Request(n, {{"pattern", "\\d+"}})).reward != 1.0) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("every outcome label is from the closed set", "[outcomes]") {
  for (absl::string_view outcome : kAllOutcomes) {
    CHECK_FALSE(outcome.empty());
  }
  auto math = NewMathScorer();
  CHECK(IsKnownOutcome(math->Score(Request("", {{"answer", "1"}})).outcome));
}

}  // namespace
}  // namespace tandem::verifier
