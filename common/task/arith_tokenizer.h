#pragma once

// The character-level tokenizer of the built-in arithmetic task, as a real
// Hugging Face `tokenizer.json`: a BPE model with empty merges whose vocab
// holds the single ASCII characters "0"-"9", "+", "-", "=" and " " (ids
// 0-13, so a digit's id is its value), and the special added tokens
// <|bos|> (14), <|eos|> (15) and <|pad|> (16); `pre_tokenizer: null` and a
// ByteLevel decoder. common/tokenizer and Hugging Face's tokenizers read
// the file identically (see common/tokenizer/tokenizer.h).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::task {

inline constexpr char kArithBosToken[] = "<|bos|>";
inline constexpr char kArithEosToken[] = "<|eos|>";
inline constexpr char kArithPadToken[] = "<|pad|>";
inline constexpr int32_t kArithBosId = 14;
inline constexpr int32_t kArithEosId = 15;
inline constexpr int32_t kArithPadId = 16;
inline constexpr int32_t kArithVocabSize = 17;

// The tokenizer.json text (pretty-printed, stable across calls).
std::string ArithTokenizerJson();

// Writes ArithTokenizerJson() to `path` (replacing it atomically through a
// temporary file in the same directory). Errors name the path.
absl::Status WriteArithTokenizer(const std::string& path);

// The tokenizer_config.json that goes with it: tokenizer_class
// PreTrainedTokenizerFast and the roles of the special tokens (bos_token
// <|bos|>, eos_token <|eos|>, pad_token <|pad|>). Without it `transformers`
// loads tokenizer.json with no eos or pad token, which generation and
// padding (e.g. TRL's GRPOTrainer) need.
std::string ArithTokenizerConfigJson();

// Writes tokenizer.json and tokenizer_config.json into the existing
// directory `dir`, each replaced atomically. Every Hugging Face directory
// Tandem writes for the built-in model carries both.
absl::Status WriteArithTokenizerFiles(const std::string& dir);

// The tokenizer parsed from ArithTokenizerJson().
absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadArithTokenizer();

}  // namespace tandem::task
