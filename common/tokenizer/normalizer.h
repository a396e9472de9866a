#pragma once

// Unicode normalization used by the `normalizer` section of tokenizer.json,
// and the character classes that added-token matching needs.

#include <string>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

// Returns the NFC form of `text`. Bytes that are not part of well-formed
// UTF-8 are copied through unchanged and the valid runs between them are
// normalized on their own, so that normalization never fails.
std::string NfcNormalize(absl::string_view text);

// Unicode White_Space (Rust's char::is_whitespace, which Hugging Face uses
// for the lstrip/rstrip of added tokens).
bool IsUnicodeWhitespace(char32_t cp);

// A Unicode word character (regex `\w`: letters, marks, numbers, connector
// punctuation such as '_', and the joiners U+200C/U+200D), which Hugging
// Face uses for the single_word rule of added tokens.
bool IsUnicodeWordCharacter(char32_t cp);

}  // namespace tandem::tokenizer
