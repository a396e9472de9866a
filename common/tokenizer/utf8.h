#pragma once

// UTF-8 repair for text that must travel in a protobuf `string` field (which
// proto3 requires to be valid UTF-8). A byte-level model's completion may
// stop in the middle of a multi-byte character (max_tokens, a stop token),
// so its decoded bytes are not always valid UTF-8; the token ids stay the
// authoritative record.

#include <string>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

// `bytes` with every byte that does not start a valid UTF-8 sequence
// replaced by U+FFFD; valid input comes back unchanged.
std::string ToValidUtf8(absl::string_view bytes);

// The length of the longest prefix of `bytes` that does not end inside a
// UTF-8 sequence (its last, incomplete character cut off): what a stream
// may send now and still never split a character across two chunks.
size_t CompleteUtf8Length(absl::string_view bytes);

}  // namespace tandem::tokenizer
