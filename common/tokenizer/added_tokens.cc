#include "common/tokenizer/added_tokens.h"

#include <algorithm>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/normalizer.h"

namespace tandem::tokenizer {
namespace {

// Decodes the character that ends `text` into `*cp` and returns its length,
// or 0 when `text` is empty or does not end with a well-formed character.
int DecodeLastUtf8(absl::string_view text, char32_t* cp) {
  for (size_t len = 1; len <= 4 && len <= text.size(); ++len) {
    if (DecodeUtf8(text.substr(text.size() - len), cp) ==
        static_cast<int>(len)) {
      return static_cast<int>(len);
    }
  }
  return 0;
}

// Number of bytes of whitespace at the end of `text`.
size_t TrailingWhitespace(absl::string_view text) {
  size_t end = text.size();
  char32_t cp;
  while (int len = DecodeLastUtf8(text.substr(0, end), &cp)) {
    if (!IsUnicodeWhitespace(cp)) break;
    end -= len;
  }
  return text.size() - end;
}

size_t LeadingWhitespace(absl::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    int len = DecodeUtf8(text.substr(pos), &cp);
    if (len == 0 || !IsUnicodeWhitespace(cp)) break;
    pos += len;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
        i);
  }
  for (std::vector<size_t>& indices : by_first_byte_) {
    std::stable_sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

void AddedTokenMatcher::Split(absl::string_view text, bool match_special,
                              std::vector<TextSegment>* out) const {
  size_t plain_start = 0;  // Start of the pending plain-text segment.
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& content = tokens_[index].content;
      if (text.substr(pos, content.size()) == content) {
        match = &tokens_[index];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + match->content.size();
    bool keep = match_special || !match->special;
    if (keep && match->single_word) {
      char32_t before;
      char32_t after;
      bool word_before = DecodeLastUtf8(text.substr(0, start), &before) > 0 &&
                         IsUnicodeWordCharacter(before);
      bool word_after = DecodeUtf8(text.substr(stop), &after) > 0 &&
                        IsUnicodeWordCharacter(after);
      keep = !word_before && !word_after;
    }
    if (!keep) {
      // Like a non-overlapping search, the next match starts after this one.
      pos = stop;
      continue;
    }
    if (match->lstrip) {
      start -=
          TrailingWhitespace(text.substr(plain_start, start - plain_start));
    }
    if (match->rstrip) stop += LeadingWhitespace(text.substr(stop));
    if (start > plain_start) {
      out->push_back(
          TextSegment{text.substr(plain_start, start - plain_start), -1});
    }
    out->push_back(TextSegment{text.substr(start, stop - start), match->id});
    plain_start = stop;
    pos = stop;
  }
  if (plain_start < text.size()) {
    out->push_back(TextSegment{text.substr(plain_start), -1});
  }
}

}  // namespace tandem::tokenizer
