#pragma once

// The `calculator` tool, shared by the reward verifier's built-in
// environment and the trainer's held-out evaluation of tools episodes so
// that both answer a call with the same observation. The evaluator: integer and decimal arithmetic with
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

namespace tandem::environment {

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

// The tool's name in tool lists and calls.
inline constexpr absl::string_view kCalculatorTool = "calculator";

// How one call of the tool went (the verifier counts these in a metric).
enum class CalculatorOutcome { kOk, kBadArguments, kError };

struct CalculatorReply {
  CalculatorOutcome outcome = CalculatorOutcome::kOk;
  // The tool message's content: the result, or "error: ..." for the model.
  std::string content;
};

// Answers one call given its JSON arguments ({"expression": "..."}).
CalculatorReply RunCalculatorCall(absl::string_view arguments_json,
                                  const CalculatorLimits& limits = {});

}  // namespace tandem::environment
