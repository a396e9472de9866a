#pragma once

// The reversible byte <-> printable-character mapping of GPT-2's byte-level
// BPE (the Hugging Face `ByteLevel` pre-tokenizer and decoder).
//
// Every byte value 0..255 is assigned one Unicode code point: printable
// Latin-1 bytes map to themselves and the remaining 68 bytes (controls, space,
// 0x7F-0xA0, 0xAD) map to U+0100.. in byte order. A byte-level vocabulary is
// written in these characters, so that every byte string has a spelling.

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

// The regular expression that GPT-2's ByteLevel pre-tokenizer uses when
// `use_regex` is true.
inline constexpr char kGpt2SplitPattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

// Returns the code point that represents `byte`.
char32_t ByteToCodePoint(uint8_t byte);

// Returns the byte that code point `cp` represents, or nullopt when `cp` is
// not one of the 256 byte characters.
std::optional<uint8_t> CodePointToByte(char32_t cp);

// Maps every byte of `bytes` (any bytes, not necessarily UTF-8) to its
// character and appends the UTF-8 encoding of those characters to `out`.
void AppendByteLevelEncoded(absl::string_view bytes, std::string* out);
std::string ByteLevelEncode(absl::string_view bytes);

// Inverse of ByteLevelEncode: returns the bytes spelled by `token`, or
// nullopt when `token` is not valid UTF-8 or contains a character outside the
// byte alphabet.
std::optional<std::string> ByteLevelDecode(absl::string_view token);

// Appends the UTF-8 encoding of `cp` to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// Decodes one UTF-8 character at the start of `text`. Returns its length in
// bytes (1..4) and stores the code point in `*cp`; returns 0 (and leaves `*cp`
// unspecified) when `text` is empty or does not start with a well-formed
// character (overlong forms, surrogates and values above U+10FFFF are
// rejected).
int DecodeUtf8(absl::string_view text, char32_t* cp);

}  // namespace tandem::tokenizer
