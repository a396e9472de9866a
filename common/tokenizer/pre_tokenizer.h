#pragma once

// The `pre_tokenizer` section of tokenizer.json: splits a text segment into
// words before BPE. Supported steps are `Split` (a regex or literal pattern,
// Isolated or Removed behaviour) and `ByteLevel` (optional GPT-2 regex split,
// optional prefix space, then the byte-to-character mapping), in any
// sequence.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

// A compiled PCRE2 pattern (UTF + UCP, JIT when available) that splits text
// into matches and the gaps between them. Subjects need not be valid UTF-8:
// bytes that are not part of a well-formed character never match and end up
// in a gap. Thread-safe: Split may be called concurrently.
class RegexSplitter {
 public:
  // `literal` treats `pattern` as a plain string. Errors carry PCRE2's
  // message and the offset in the pattern.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(
      absl::string_view pattern, bool literal);
  ~RegexSplitter();

  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends to `pieces` every non-empty match and, when `keep_gaps`, every
  // non-empty gap between matches, in text order. The views point into
  // `text`.
  void Split(absl::string_view text, bool keep_gaps,
             std::vector<absl::string_view>* pieces) const;

 private:
  explicit RegexSplitter(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*, owned.
};

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // kSplit: the pattern; kByteLevel: the GPT-2 pattern when use_regex, else
  // null.
  std::shared_ptr<const RegexSplitter> regex;
  // kSplit: true for behavior Isolated, false for Removed.
  bool keep_gaps = true;
  // kByteLevel: prepend a space to a word that does not start with one.
  bool add_prefix_space = false;
};

// Thread-safe (const after construction).
class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps)
      : steps_(std::move(steps)) {}

  // Splits `text` into words, appended to `words`. With no steps the whole
  // text is one word.
  void Run(absl::string_view text, std::vector<std::string>* words) const;

  // True when a ByteLevel step maps words into the byte alphabet.
  bool byte_level() const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace tandem::tokenizer
