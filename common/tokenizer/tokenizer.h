#pragma once

// A tokenizer loaded from a Hugging Face `tokenizer.json`: byte-level BPE
// (GPT-2, Qwen2/Qwen3, Llama-3) and character-level BPE vocabularies.
//
// Encode runs, in order:
//   1. added tokens (special and not) matched in the raw text, longest
//      first (see added_tokens.h for single_word / lstrip / rstrip);
//   2. the normalizer (NFC) on the text between them, then the added tokens
//      marked `normalized: true` on the normalized text;
//   3. the pre-tokenizer (Split regex and/or ByteLevel) and BPE per word.
// Decode concatenates each token's bytes. With a ByteLevel decoder these are
// raw bytes, so a token whose bytes are not valid UTF-8 on their own decodes
// exactly, and concatenating the decoded bytes of a whole sequence gives back
// the (normalized) text. An added token decodes to its content verbatim, as
// in transformers and transformers.js (Hugging Face's Rust decoder instead
// byte-maps it too, which differs only for contents with characters such as
// "é" or "Ġ" and would not give back the text).
//
// Character-level vocabularies: a BPE model with empty merges whose vocab
// holds single ASCII characters, `pre_tokenizer: null` and a `ByteLevel`
// decoder. Hugging Face's tokenizers then looks up each raw character (" ",
// "+", "7"), and its ByteLevel decoder passes a token containing a character
// outside the byte alphabet (such as " ") through as UTF-8, so the same file
// round-trips in both implementations. Keep such vocabularies ASCII: a
// Latin-1 character such as "é" is itself in the byte alphabet and would be
// decoded as one raw byte. (transformers.js lacks that pass-through; a file
// meant for it too should use `pre_tokenizer: ByteLevel` with
// use_regex=false and spell the space "Ġ", which all three handle alike.
// With `decoder: null`, Hugging Face joins tokens with spaces; Decode does
// the same for fidelity.)
//
// Unsupported tokenizer.json features fail to load (see tokenizer_json.h);
// the post-processor is ignored: Encode never adds BOS/EOS.
//
// Input text need not be valid UTF-8. With a ByteLevel pre-tokenizer stray
// bytes are kept (as their byte-level tokens) and decode back unchanged;
// without one they are characters missing from the vocabulary (unk_token or
// nothing). Nothing crashes on any input.
//
// Thread safety: all const methods may be called concurrently.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"

namespace tandem::tokenizer {

class Tokenizer {
 public:
  // Reads and parses `path`; errors name the path.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(
      const std::string& path);
  // Parses tokenizer.json text; `source_name` prefixes error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view json, absl::string_view source_name);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. With `parse_special` false, special added tokens
  // written in the text are encoded as plain text (non-special added tokens
  // still match), like Hugging Face's `split_special_tokens=True`.
  std::vector<int32_t> Encode(absl::string_view text,
                              bool parse_special = true) const;

  // The bytes of `ids` concatenated. Ids outside [0, vocab_size()) or not
  // assigned to a token contribute nothing; `skip_special` drops special
  // added tokens.
  std::string Decode(absl::Span<const int32_t> ids,
                     bool skip_special = false) const;

  // The bytes that token `id` decodes to (empty for an unknown id). Useful
  // for streaming: concatenating these for a sequence equals Decode.
  std::string TokenBytes(int32_t id) const;

  // The token's string as written in tokenizer.json, e.g. "Ġthe".
  std::optional<std::string> TokenString(int32_t id) const;

  // The id of a token given as written in tokenizer.json (added tokens
  // first, then the model vocabulary).
  std::optional<int32_t> TokenId(absl::string_view token) const;

  bool IsSpecial(int32_t id) const;

  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const {
    return static_cast<int32_t>(token_strings_.size());
  }

  const std::string& source_name() const { return source_name_; }

 private:
  Tokenizer() = default;

  void EncodePlain(absl::string_view text, std::vector<int32_t>* ids) const;

  std::string source_name_;
  std::unique_ptr<BpeModel> model_;
  bool nfc_ = false;
  PreTokenizer pre_tokenizer_;
  DecoderKind decoder_ = DecoderKind::kNone;
  AddedTokenMatcher raw_added_;         // normalized: false
  AddedTokenMatcher normalized_added_;  // normalized: true
  absl::flat_hash_map<std::string, int32_t> added_ids_;

  // Indexed by id; a missing id has an empty string and no flags.
  std::vector<std::string> token_strings_;
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> token_flags_;
};

}  // namespace tandem::tokenizer
