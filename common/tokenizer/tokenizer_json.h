#pragma once

// Parsing and validation of a Hugging Face `tokenizer.json` into a plain
// description of the pipeline. Everything that the runtime does not
// implement is rejected here with a Status naming the source, the JSON path
// and the offending value, e.g.
//   qwen/tokenizer.json: model.type: unsupported model type "WordPiece"
//
// Supported sections:
//   normalizer     null, NFC, or a Sequence whose members are NFC (or empty)
//   pre_tokenizer  null, ByteLevel, Split (Regex or String pattern, behavior
//                  Isolated or Removed, invert false), or a Sequence of these
//   model          BPE: vocab, merges ("a b" strings or ["a", "b"] pairs),
//                  unk_token, fuse_unk, ignore_merges; dropout must be null,
//                  byte_fallback false, no subword prefix/suffix
//   added_tokens   id, content, special, single_word, lstrip, rstrip,
//                  normalized (defaults as in Hugging Face)
//   decoder        null or ByteLevel
//   post_processor, truncation, padding: ignored (Encode never adds template
//                  tokens such as BOS; callers add them explicitly)

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace tandem::tokenizer {

enum class DecoderKind {
  // Hugging Face joins the token strings with single spaces.
  kNone,
  // Each token's characters are mapped back to bytes; a token with a
  // character outside the byte alphabet contributes its UTF-8 text as is.
  kByteLevel,
};

struct TokenizerSpec {
  bool nfc = false;
  std::vector<PreTokenizerStep> pre_tokenizer;
  DecoderKind decoder = DecoderKind::kNone;
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  BpeOptions bpe_options;
  std::vector<AddedToken> added_tokens;
};

// Largest token id accepted; guards the id-indexed tables against absurd ids.
inline constexpr int32_t kMaxTokenId = (1 << 24) - 1;

// `source_name` (usually the file path) prefixes every error message.
absl::StatusOr<TokenizerSpec> ParseTokenizerJson(absl::string_view json,
                                                 absl::string_view source_name);

}  // namespace tandem::tokenizer
