#pragma once

// "math": compares the final answer of a completion with metadata.answer.
//
// Metadata:
//   answer  (required, non-empty) the reference answer, e.g. "3/4",
//           "\frac{3}{4}", "1,000", "-2.5", or a non-numeric expression.
//
// The final answer is extracted and numbers are compared as documented in
// answer_parsing.h (last \boxed{}, else "answer is"/"Answer:", else the last
// number; exact rational equality). When the reference is a number, the
// completion's answer must parse as an equal number; an extracted
// "x = 5" counts as its right-hand side "5". When the reference is not a
// number, both are compared as NormalizeAnswer() text with all whitespace
// removed; a reference that normalizes to nothing (e.g. ".") matches
// nothing.
//
// Outcomes: correct (reward 1), incorrect (0), no_answer (0, nothing could
// be extracted). Thread-safe: the scorer is stateless.

#include <memory>

#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

std::unique_ptr<Scorer> NewMathScorer();

}  // namespace tandem::verifier
