#pragma once

// ChoiceAssembler turns the tokens a served request's samples receive into
// OpenAI choices: token ids, behaviour log-probs and policy versions, the
// decoded text (special tokens skipped), stop strings (the text ends before
// the first match; the sample is to be cancelled), and, for streams, the
// deltas not yet sent. Text is held back in a stream while it could be the
// start of a stop string or ends inside a UTF-8 character, so the
// concatenated deltas equal the non-streaming text.
//
// Chat requests with tools (ToolParsing): a choice that stopped is parsed
// for the model's tool calls (chat::ParseToolCalls on its text with
// special tokens, trailing special tokens such as the end of turn
// dropped); when it made any, the choice carries them, its text becomes
// the text outside them, and its finish_reason is "tool_calls". A call's
// arguments are the model's own JSON text with the whitespace outside
// strings removed (chat::ToolCallStream reads them), so that a stream and
// a response carry the same text. A stream sends the calls as they are
// generated (chat::ToolCallStream): the content outside them, a call's
// header (index, id, name) once its name is known, then fragments of its
// arguments; the markup of the calls never goes out as content. A turn
// whose calls do not parse ends as without tools (finish_reason "stop",
// the whole text as content): its last delta carries as content the text
// the stream held back; deltas of a call sent before the turn turned out
// malformed are not taken back.
//
// Not thread-safe: the HTTP session that owns it uses it from its one
// thread.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/chat/tool_call_stream.h"
#include "engine/sequence.h"
#include "services/rollout/openai_protocol.h"
#include "services/rollout/serving_queue.h"

namespace tandem::tokenizer {
class Tokenizer;
}  // namespace tandem::tokenizer

namespace tandem::rollout::openai {

class ChoiceAssembler {
 public:
  struct ToolParsing {
    chat::ToolCallFormat format = chat::ToolCallFormat::kHermes;
    // Call ids are this + the choice index + "_" + the call's index.
    std::string id_prefix = "call_";
  };
  // `tokenizer` must outlive the assembler. `tools`: parse tool calls.
  ChoiceAssembler(const tokenizer::Tokenizer* tokenizer, int32_t n,
                  std::vector<std::string> stop,
                  std::optional<ToolParsing> tools = std::nullopt);

  // Appends sampled tokens to choice `index`. Returns true when a stop
  // string ended it now (the caller cancels that sample in the engine);
  // tokens after that are ignored.
  bool Absorb(int32_t index, const std::vector<ServedToken>& tokens);
  // The engine finished sample `index` (ignored once a stop string did).
  void Finish(int32_t index, engine::FinishReason reason);

  bool all_done() const;
  int64_t completion_tokens() const;

  // What choice `index` has that no earlier delta carried, or nullopt when
  // nothing (the last delta of a choice carries its finish_reason).
  // `first` is set on a choice's first delta.
  std::optional<ChoiceResult> TakeDelta(int32_t index, bool* first);
  // Every choice, whole (for a non-streaming response).
  std::vector<ChoiceResult> Results() const;

 private:
  // One token's bytes as the tool-call reader sees them (ToolParsing).
  struct Piece {
    std::string bytes;
    bool special = false;
    size_t visible_end = 0;  // Choice::bytes's size after this token
  };
  struct Choice {
    ChoiceResult result;
    std::string bytes;  // decoded so far (may end inside a character)
    size_t sent_tokens = 0;
    size_t sent_bytes = 0;
    bool sent_any = false;
    bool sent_final = false;
    bool done = false;
    // ToolParsing: the tokens not yet given to `calls`, the reader of the
    // calls, the content a stream sent, and whether the reader's calls are
    // the parsed ones.
    std::vector<Piece> pieces;
    size_t fed_pieces = 0;
    std::optional<chat::ToolCallStream> calls;
    std::string sent_content;
    bool calls_agree = false;
  };

  // Gives choice `c`'s tool-call reader the tokens whose visible text ends
  // at or before `limit` bytes (`last`: cuts the token that crosses it and
  // drops the trailing special tokens; otherwise holds trailing special
  // tokens back until a plain token follows them).
  void FeedCalls(Choice& c, size_t limit, bool last) const;
  // Parses choice `c`'s calls once it ended (ToolParsing).
  void ParseCalls(Choice& c) const;
  // The delta of a choice with ToolParsing.
  void TakeToolDelta(Choice& c, ChoiceResult* delta);

  const tokenizer::Tokenizer* const tokenizer_;
  const std::vector<std::string> stop_;
  const std::optional<ToolParsing> tools_;
  size_t max_stop_bytes_ = 0;
  std::vector<Choice> choices_;
};

// "stop", "length" or "abort".
const char* FinishReasonText(engine::FinishReason reason);

}  // namespace tandem::rollout::openai
