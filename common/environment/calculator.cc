#include "common/environment/calculator.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem::environment {
namespace {

struct Value {
  bool is_int = true;
  int64_t i = 0;
  double d = 0;
  double AsDouble() const { return is_int ? static_cast<double>(i) : d; }
};

Value Int(int64_t i) { return Value{true, i, 0}; }
Value Dbl(double d) { return Value{false, 0, d}; }

class Parser {
 public:
  Parser(absl::string_view text, const CalculatorLimits& limits)
      : text_(text), limits_(limits) {}

  absl::StatusOr<Value> Parse() {
    absl::StatusOr<Value> value = Sum(0);
    if (!value.ok()) return value;
    SkipSpace();
    if (pos_ < text_.size()) {
      return Error(absl::StrCat("unexpected '", text_.substr(pos_, 1), "'"));
    }
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " at position ", pos_));
  }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           std::isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Eat(absl::string_view token) {
    SkipSpace();
    if (text_.substr(pos_, token.size()) == token) {
      pos_ += token.size();
      return true;
    }
    return false;
  }

  // sum := product (('+' | '-') product)*
  absl::StatusOr<Value> Sum(int depth) {
    absl::StatusOr<Value> left = Product(depth);
    while (left.ok()) {
      if (Eat("+")) {
        absl::StatusOr<Value> right = Product(depth);
        if (!right.ok()) return right;
        left = Add(*left, *right, +1);
      } else if (Eat("-")) {
        absl::StatusOr<Value> right = Product(depth);
        if (!right.ok()) return right;
        left = Add(*left, *right, -1);
      } else {
        break;
      }
    }
    return left;
  }

  // product := unary (('*' | '/') unary)*   ('**' belongs to power)
  absl::StatusOr<Value> Product(int depth) {
    absl::StatusOr<Value> left = Unary(depth);
    while (left.ok()) {
      SkipSpace();
      if (text_.substr(pos_, 2) == "**") break;  // Cannot happen: Power ate.
      if (Eat("*")) {
        absl::StatusOr<Value> right = Unary(depth);
        if (!right.ok()) return right;
        left = Multiply(*left, *right);
      } else if (Eat("/")) {
        absl::StatusOr<Value> right = Unary(depth);
        if (!right.ok()) return right;
        left = Divide(*left, *right);
      } else {
        break;
      }
    }
    return left;
  }

  // unary := ('-' | '+') unary | power
  absl::StatusOr<Value> Unary(int depth) {
    if (depth > limits_.max_depth) {
      return Error(absl::StrCat("nesting deeper than ", limits_.max_depth));
    }
    if (Eat("-")) {
      absl::StatusOr<Value> v = Unary(depth + 1);
      if (!v.ok()) return v;
      if (v->is_int && v->i != INT64_MIN) return Int(-v->i);
      return Dbl(-v->AsDouble());
    }
    if (Eat("+")) return Unary(depth + 1);
    return Power(depth);
  }

  // power := atom ('**' unary)?   (right-associative, binds tighter than
  // unary minus on its left: -2**2 = -4)
  absl::StatusOr<Value> Power(int depth) {
    absl::StatusOr<Value> base = Atom(depth);
    if (!base.ok()) return base;
    if (!Eat("**")) return base;
    absl::StatusOr<Value> exponent = Unary(depth + 1);
    if (!exponent.ok()) return exponent;
    return Pow(*base, *exponent);
  }

  // atom := number | '(' sum ')'
  absl::StatusOr<Value> Atom(int depth) {
    SkipSpace();
    if (Eat("(")) {
      if (depth + 1 > limits_.max_depth) {
        return Error(absl::StrCat("nesting deeper than ", limits_.max_depth));
      }
      absl::StatusOr<Value> v = Sum(depth + 1);
      if (!v.ok()) return v;
      if (!Eat(")")) return Error("missing ')'");
      return v;
    }
    const size_t start = pos_;
    bool dot = false;
    while (pos_ < text_.size() &&
           (std::isdigit(static_cast<unsigned char>(text_[pos_])) ||
            (text_[pos_] == '.' && !dot))) {
      dot = dot || text_[pos_] == '.';
      ++pos_;
    }
    const std::string number(text_.substr(start, pos_ - start));
    if (number.empty() || number == ".") {
      pos_ = start;
      if (pos_ >= text_.size()) return Error("expected a number");
      return Error(
          absl::StrCat("expected a number, got '", text_.substr(pos_, 1), "'"));
    }
    if (!dot) {
      errno = 0;
      const long long i = std::strtoll(number.c_str(), nullptr, 10);
      if (errno != ERANGE) return Int(i);
    }
    return Dbl(std::strtod(number.c_str(), nullptr));
  }

  static absl::StatusOr<Value> Add(const Value& a, const Value& b, int sign) {
    int64_t out;
    if (a.is_int && b.is_int &&
        !(sign > 0 ? __builtin_add_overflow(a.i, b.i, &out)
                   : __builtin_sub_overflow(a.i, b.i, &out))) {
      return Int(out);
    }
    return Dbl(a.AsDouble() + sign * b.AsDouble());
  }
  static absl::StatusOr<Value> Multiply(const Value& a, const Value& b) {
    int64_t out;
    if (a.is_int && b.is_int && !__builtin_mul_overflow(a.i, b.i, &out)) {
      return Int(out);
    }
    return Dbl(a.AsDouble() * b.AsDouble());
  }
  absl::StatusOr<Value> Divide(const Value& a, const Value& b) const {
    if (b.AsDouble() == 0) return Error("division by zero");
    if (a.is_int && b.is_int && !(a.i == INT64_MIN && b.i == -1) &&
        a.i % b.i == 0) {
      return Int(a.i / b.i);
    }
    return Dbl(a.AsDouble() / b.AsDouble());
  }
  absl::StatusOr<Value> Pow(const Value& base, const Value& exponent) const {
    const double e = exponent.AsDouble();
    if (std::fabs(e) > limits_.max_exponent) {
      return Error(absl::StrCat("exponent ", e, " is larger than ",
                                limits_.max_exponent));
    }
    if (base.AsDouble() == 0 && e < 0) return Error("division by zero");
    if (base.is_int && exponent.is_int && exponent.i >= 0) {
      int64_t out = 1;
      bool overflow = false;
      for (int64_t k = 0; k < exponent.i && !overflow; ++k) {
        overflow = __builtin_mul_overflow(out, base.i, &out);
      }
      if (!overflow) return Int(out);
    }
    if (base.AsDouble() < 0 && std::floor(e) != e) {
      return Error("a negative number to a fractional power");
    }
    return Dbl(std::pow(base.AsDouble(), e));
  }

  absl::string_view text_;
  const CalculatorLimits& limits_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::string> EvaluateCalculator(absl::string_view expression,
                                               const CalculatorLimits& limits) {
  if (expression.size() > limits.max_chars) {
    return absl::InvalidArgumentError(
        absl::StrCat("expression of ", expression.size(),
                     " characters is longer than ", limits.max_chars));
  }
  Parser parser(expression, limits);
  absl::StatusOr<Value> value = parser.Parse();
  if (!value.ok()) return value.status();
  if (value->is_int) return absl::StrCat(value->i);
  if (!std::isfinite(value->d)) {
    return absl::InvalidArgumentError("the result is not a finite number");
  }
  // Integral doubles of moderate size print without a fraction.
  if (std::floor(value->d) == value->d && std::fabs(value->d) < 1e15) {
    return absl::StrFormat("%.0f", value->d);
  }
  return absl::StrFormat("%.15g", value->d);
}

CalculatorReply RunCalculatorCall(absl::string_view arguments_json,
                                  const CalculatorLimits& limits) {
  const nlohmann::json args =
      nlohmann::json::parse(arguments_json, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() || !args.is_object()) {
    return {CalculatorOutcome::kBadArguments,
            "error: arguments must be a JSON object like "
            "{\"expression\": \"1 + 2\"}"};
  }
  auto it = args.find("expression");
  if (it == args.end() || !it->is_string()) {
    return {CalculatorOutcome::kBadArguments,
            "error: argument \"expression\" (a string) is required"};
  }
  absl::StatusOr<std::string> value =
      EvaluateCalculator(it->get<std::string>(), limits);
  if (!value.ok()) {
    return {CalculatorOutcome::kError,
            absl::StrCat("error: ", value.status().message())};
  }
  return {CalculatorOutcome::kOk, *std::move(value)};
}

}  // namespace tandem::environment
