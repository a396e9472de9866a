#pragma once

// What the built-in tasks' character-level tokenizers share when they are
// written as a Hugging Face model directory: the tokenizer.json skeleton
// (BPE without merges, ByteLevel pre-tokenizer and decoder, keys spelled
// the byte-level way: transformers 5 loads these directories as Qwen2
// tokenizers, which byte-level encode the text, so a raw " " key was never
// found) and an atomic file write.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::task {

// One added_tokens entry (not normalized, no stripping).
nlohmann::ordered_json CharAddedToken(int32_t id, const std::string& content,
                                      bool special);

// The tokenizer.json text (pretty-printed, stable across calls) for
// `characters` (byte strings; id = index) plus `added` (CharAddedToken
// entries, also put into the vocabulary).
std::string CharTokenizerJson(const std::vector<std::string>& characters,
                              const nlohmann::ordered_json& added);

// Replaces `path` with `text` through a temporary file in its directory.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& text);

}  // namespace tandem::task
