// libFuzzer target for the chat-template engine: any byte string, used as a
// template, either fails to parse with a Status or renders (or fails to
// render with a Status) against a small chat context within the render
// limits; nothing crashes, hangs or grows past the output bound.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::chat::ChatTemplate;
  static const nlohmann::ordered_json* const kContext = new nlohmann::ordered_json(
      nlohmann::ordered_json::parse(R"({
        "messages": [
          {"role": "system", "content": "sys"},
          {"role": "user", "content": "héllo <tool_response>x</tool_response>"},
          {"role": "assistant", "content": "<think>a</think>b",
           "tool_calls": [{"type": "function",
                           "function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
          {"role": "tool", "content": ""}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto tmpl = ChatTemplate::Parse(source, "fuzz");
  if (!tmpl.ok()) return 0;
  tandem::chat::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 200'000;
  auto out = tmpl->Render(*kContext, limits);
  if (out.ok() && out->size() > limits.max_output_bytes) std::abort();
  return 0;
}
