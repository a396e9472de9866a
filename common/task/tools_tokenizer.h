#pragma once

// The character-level tokenizer and chat template of the built-in "tools"
// task (common/task/tools_task.h), as a real Hugging Face tokenizer
// directory: `tokenizer.json` (a BPE model with empty merges whose vocab
// holds "\n" and every printable ASCII character, " " to "~", ids 0-95,
// `pre_tokenizer: null` and a ByteLevel decoder, as the arithmetic
// tokenizer), the added tokens below, and a `tokenizer_config.json` whose
// `chat_template` is a minimal ChatML one:
//
//   <|im_start|>user\n4821*7312<|im_end|>\n
//   <|im_start|>assistant\n<tool_call>{...}</tool_call><|im_end|>\n
//   <|im_start|>tool\n35251152<|im_end|>\n
//   <|im_start|>assistant\n35251152<|im_end|>\n
//
// Every printable character is in the vocabulary, so a tool's error message
// (which the model reads as an observation) tokenizes without loss. The
// tool-call tags are single tokens (non-special, as in Qwen2.5), so a call
// costs the tiny model two tokens of markup instead of 23.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::task {

inline constexpr char kToolsImStartToken[] = "<|im_start|>";
inline constexpr char kToolsImEndToken[] = "<|im_end|>";
inline constexpr char kToolsCallOpenToken[] = "<tool_call>";
inline constexpr char kToolsCallCloseToken[] = "</tool_call>";
inline constexpr char kToolsEndOfTextToken[] = "<|endoftext|>";
inline constexpr char kToolsPadToken[] = "<|pad|>";
inline constexpr int32_t kToolsCharacterCount = 96;
inline constexpr int32_t kToolsImStartId = 96;
inline constexpr int32_t kToolsImEndId = 97;
inline constexpr int32_t kToolsCallOpenId = 98;
inline constexpr int32_t kToolsCallCloseId = 99;
inline constexpr int32_t kToolsEndOfTextId = 100;
inline constexpr int32_t kToolsPadId = 101;
inline constexpr int32_t kToolsVocabSize = 102;

// The tokenizer.json text (pretty-printed, stable across calls).
std::string ToolsTokenizerJson();

// The chat template's Jinja source.
std::string ToolsChatTemplate();

// tokenizer_config.json: tokenizer_class PreTrainedTokenizerFast,
// eos_token <|im_end|> (a model turn ends there), pad_token <|pad|>, no
// bos_token, and chat_template ToolsChatTemplate().
std::string ToolsTokenizerConfigJson();

// Writes tokenizer.json and tokenizer_config.json into the existing
// directory `dir`, each replaced atomically. Errors name the path.
absl::Status WriteToolsTokenizerFiles(const std::string& dir);

// The tokenizer parsed from ToolsTokenizerJson().
absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadToolsTokenizer();

}  // namespace tandem::task
