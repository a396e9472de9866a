#pragma once

// "regex": reward 1 when the completion matches a PCRE2 pattern.
//
// Metadata:
//   pattern         (required) PCRE2 syntax, UTF-8. A pattern that does not
//                   compile is InvalidArgument naming metadata.pattern, with
//                   PCRE2's message and the offset.
//   match           (optional, default "full") "full": the whole completion,
//                   with leading and trailing ASCII whitespace removed, must
//                   match; "search": the pattern may match anywhere in the
//                   unmodified completion.
//   case_sensitive  (optional, default true) "true"/"false"/"1"/"0".
//
// Invalid UTF-8 in the completion never matches a non-ASCII pattern item
// but is not an error (PCRE2_MATCH_INVALID_UTF). Matching is bounded by
// PCRE2 match, depth and heap limits, so a pattern with catastrophic
// backtracking cannot stall a worker: it returns outcome "error".
//
// Outcomes: correct (1), incorrect (0), error (0; a match limit was hit).
// Thread-safe: the pattern is compiled per call; nothing is shared.

#include <memory>

#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

std::unique_ptr<Scorer> NewRegexScorer();

}  // namespace tandem::verifier
