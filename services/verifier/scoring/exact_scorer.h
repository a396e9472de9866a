#pragma once

// "exact": the completion, with leading and trailing ASCII whitespace
// removed, must equal metadata.answer with the same trimming.
//
// Metadata:
//   answer          (required) the reference string; may be empty.
//   case_sensitive  (optional, default true) "true"/"false"/"1"/"0"; when
//                   false, ASCII letters compare case-insensitively.
//
// Outcomes: correct (1), incorrect (0), no_answer (0; the completion is
// empty or whitespace while the answer is not). Thread-safe (stateless).

#include <memory>

#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

std::unique_ptr<Scorer> NewExactScorer();

}  // namespace tandem::verifier
