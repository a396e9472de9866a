#pragma once

// Tool calls parsed out of one model turn, in the model family's own format.
//
// A multi-turn episode hands the environment the model's turn as text plus
// the calls it made (tandem.v1.Action). Models write calls in their chat
// template's convention, so the worker parses the turn's decoded text here:
//
//   kHermes  Qwen2.5/Qwen3, Hermes and the built-in demo model:
//            zero or more `<tool_call>{"name": ..., "arguments": {...}}
//            </tool_call>` blocks anywhere in the turn.
//   kLlama3  Llama 3.x: the whole turn is one JSON object `{"name": ...,
//            "parameters": {...}}` (or "arguments"), or text followed by
//            `<|python_tag|>` and one or more such objects separated by `;`.
//
// Trailing end-of-turn tokens (`<|im_end|>`, `<|endoftext|>`, `<|eom_id|>`,
// `<|eot_id|>`) are ignored in both formats.
//
// Parsing never throws and never blocks; a malformed call is an
// InvalidArgument error that says which call, at which byte, and why, so
// the episode can send that text to the environment as the observation.
// Thread-safe (pure functions).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat {

enum class ToolCallFormat { kHermes, kLlama3 };

// "hermes", "qwen" and "demo" name kHermes; "llama3" names kLlama3.
// InvalidArgument for anything else (the message lists the names).
absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);

struct ParsedToolCall {
  // `id_prefix` + the call's index in the turn ("call_0", "call_1", ...).
  std::string id;
  std::string name;
  // The arguments as a compact JSON object text ("{}" when the call gave
  // none). A model that wrote the arguments as a JSON string keeps that
  // string's contents verbatim (the environment judges them).
  std::string arguments_json;
  bool operator==(const ParsedToolCall&) const = default;
};

struct ParsedTurn {
  // The turn's text outside the calls (Hermes: every byte outside the
  // <tool_call> blocks, in order; Llama 3: the text before <|python_tag|>,
  // or the whole turn when it makes no call), with surrounding whitespace
  // trimmed.
  std::string content;
  std::vector<ParsedToolCall> calls;
};

struct ToolCallLimits {
  int32_t max_calls = 32;
};

// Parses `turn` (the decoded text of one model turn, special tokens
// included). A turn without calls is not an error: `calls` is empty.
absl::StatusOr<ParsedTurn> ParseToolCalls(std::string_view turn,
                                          ToolCallFormat format,
                                          std::string_view id_prefix = "call_",
                                          const ToolCallLimits& limits = {});

}  // namespace tandem::chat
