#pragma once

// The `calculator` tool's evaluator: integer and decimal arithmetic with
// + - * / ** and parentheses, evaluated in process by a recursive-descent
// parser with strict bounds (no sandbox child: nothing is executed, the
// bounds below cap the work at a few microseconds per call).
//
// Integers are exact (int64) while they fit; an operation that overflows,
// a division that is not exact, or a decimal operand switches to double.
// Errors are InvalidArgument with a message meant for the model (it is the
// tool's observation): what was wrong and where.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::verifier {

struct CalculatorLimits {
  // Characters of the expression.
  size_t max_chars = 256;
  // Nesting of parentheses and unary signs.
  int max_depth = 32;
  // |exponent| of **.
  double max_exponent = 1024;
};

// Evaluates `expression`; returns the result as text ("42", "0.5",
// "1.2345678901234567e+30").
absl::StatusOr<std::string> EvaluateCalculator(
    absl::string_view expression, const CalculatorLimits& limits = {});

}  // namespace tandem::verifier
