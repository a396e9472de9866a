#pragma once

// Matching of `added_tokens` in text, before BPE.
//
// Semantics follow Hugging Face's AddedVocabulary:
// - At each position the longest token that matches wins (leftmost-longest,
//   non-overlapping).
// - `single_word`: a match is kept only if it is neither preceded nor
//   followed by a word character (regex \w); otherwise that text stays
//   plain text.
// - `lstrip` / `rstrip`: Unicode whitespace immediately before / after a
//   kept match is absorbed into the token (it produces no ids).
// - A matcher holds the tokens of one `normalized` flavour; the tokenizer
//   runs the `normalized: false` ones on raw text and the `normalized: true`
//   ones on the normalized remainder.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A piece of text: either plain text (`token_id < 0`) or one added token.
struct TextSegment {
  absl::string_view text;
  int32_t token_id = -1;
};

// Thread-safe (const after construction).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  // Splits `text` into plain-text and token segments, appended to `out` in
  // order (plain segments are non-empty). When `match_special` is false a
  // match of a special token is treated as plain text, which is Hugging
  // Face's `split_special_tokens`.
  void Split(absl::string_view text, bool match_special,
             std::vector<TextSegment>* out) const;

 private:
  std::vector<AddedToken> tokens_;
  // Indexed by the first byte of the content: indices into tokens_, longest
  // first.
  std::array<std::vector<size_t>, 256> by_first_byte_;
};

}  // namespace tandem::tokenizer
