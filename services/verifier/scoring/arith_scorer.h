#pragma once

// "arith": the built-in synthetic arithmetic task, whose completions are a
// bare integer followed by an end.
//
// Metadata:
//   answer      (required) an integer: optional '-', then one or more ASCII
//               digits, optionally surrounded by ASCII whitespace.
//   end_marker  (optional) one more end-of-sequence marker, in addition to
//               kArithEndMarkers, e.g. the tokenizer's EOS text.
//
// Scoring, exactly:
//   1. The completion is cut at the earliest of: the first '\n', and the
//      first occurrence of any end marker. Everything from there on is
//      ignored, including a second line or text after the marker.
//   2. Spaces, tabs and '\r' at both ends of what remains are removed.
//   3. What remains must be an optional '-' followed by one or more ASCII
//      digits and nothing else (no '+', no thousands separators, no spaces
//      inside, no decimal point). Otherwise the outcome is no_answer.
//   4. Reward 1 (correct) iff that integer equals metadata.answer, compared
//      by value with arbitrary length: leading zeros do not matter and -0
//      equals 0. Otherwise reward 0 (incorrect).
//
// Thread-safe (stateless).

#include <array>
#include <memory>

#include "absl/strings/string_view.h"
#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

inline constexpr std::array<absl::string_view, 6> kArithEndMarkers = {
    "</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>", "<|end|>"};

std::unique_ptr<Scorer> NewArithScorer();

}  // namespace tandem::verifier
