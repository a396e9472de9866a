#pragma once

// ToolCallStream reads a model turn's tool calls while the turn is still
// being generated, for streamed chat responses: OpenAI's clients expect a
// call to arrive piecewise (a first delta with the call's index, id and
// name, then deltas with fragments of its arguments) and its markup never
// to appear as `content`.
//
// The turn's text (the decoded text with special tokens, as ParseToolCalls
// reads it) is appended as it grows. Take() says what a stream can send
// now that it did not send before:
//   * content: text outside the calls that can no longer turn out to be
//     part of one (a possible beginning of `<tool_call>` or
//     `<|python_tag|>` is held back), with the turn's leading whitespace
//     dropped and trailing whitespace held until more text follows, so
//     that the concatenated content equals ParseToolCalls's trimmed
//     content;
//   * per call: its header (id, name) once the name is known, and the
//     fragments of its arguments as they are written. The arguments are
//     the model's own JSON text of the arguments object with the
//     whitespace outside strings removed (keys in the model's order);
//     arguments written as a JSON string, or under the second-choice key
//     ("parameters" for Hermes, "arguments" for Llama 3), arrive whole
//     when the call's object closes.
//
// The stream only reads; it never decides that a turn failed. A turn whose
// calls turn out malformed simply stops producing call deltas; the caller
// parses the whole turn with ParseToolCalls at its end and compares
// (calls()), as the OpenAI endpoint does (services/rollout/openai_choices.h).
// Incomplete UTF-8 at the end of the text is never emitted.
//
// Not thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/chat/tool_calls.h"

namespace tandem::chat {

class ToolCallStream {
 public:
  struct CallDelta {
    int32_t index = 0;
    // The call's first delta carries its id and name (header true).
    bool header = false;
    std::string id;
    std::string name;
    // A fragment of the arguments ("" is possible on a header).
    std::string arguments;
    bool operator==(const CallDelta&) const = default;
  };
  struct Delta {
    std::string content;
    std::vector<CallDelta> calls;
    bool empty() const { return content.empty() && calls.empty(); }
  };

  // Call ids are `id_prefix` + the call's index, as ParseToolCalls names
  // them.
  ToolCallStream(ToolCallFormat format, std::string id_prefix);

  // Appends the next bytes of the turn.
  void Append(std::string_view text);

  // What can be sent now and was not sent before.
  Delta Take();

  // The whole text appended so far.
  const std::string& text() const { return text_; }

  // The calls read so far (name and the arguments as Take sends them);
  // `complete` is set once the call's object closed with a name.
  struct Call {
    std::string id;
    std::string name;
    std::string arguments;
    bool complete = false;
  };
  std::vector<Call> calls() const;

 private:
  enum class Mode {
    kText,        // outside calls
    kBeforeBody,  // Hermes: after <tool_call>, before the object
    kObject,      // inside a call's JSON object
    kAfterBody,   // Hermes: after the object, before </tool_call>
    kCallList,    // Llama 3: between call objects
    kBroken,      // the calls do not parse: read no further
  };
  // Where a top-level member of the call object is.
  enum class Member { kExpectKey, kKey, kExpectColon, kExpectValue, kValue };

  struct CallState {
    Call call;
    size_t sent_arguments = 0;
    bool header_sent = false;
    // The preferred key's object value is being read into call.arguments
    // (live) or was (streams): its fragments can be sent as they come.
    bool live_arguments = false;
    bool streams_arguments = false;
    // The raw (whitespace-free) values of the argument keys seen.
    std::string preferred_raw;
    std::string fallback_raw;
  };

  void Scan();
  // Reads text outside calls; false when it must wait for more text.
  bool ScanText();
  void BeginObject();
  void ScanObjectChar(char c);
  void Record(char c);
  void BeginValue(char c);
  void EndValue();
  void EndObject();
  void AddContent(std::string_view text);

  const ToolCallFormat format_;
  const std::string id_prefix_;
  const std::string_view marker_;     // <tool_call> or <|python_tag|>
  const std::string_view preferred_;  // "arguments" or "parameters"
  const std::string_view fallback_;

  std::string text_;
  size_t pos_ = 0;  // bytes of text_ read
  Mode mode_ = Mode::kText;

  std::string content_;  // content ready to send
  size_t sent_content_ = 0;
  std::string pending_space_;  // trailing whitespace held back
  bool content_started_ = false;

  std::vector<CallState> states_;

  // The call object being read.
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  Member member_ = Member::kExpectKey;
  std::string key_raw_;
  std::string key_;
  std::string value_raw_;
  char value_kind_ = 0;
};

}  // namespace tandem::chat
