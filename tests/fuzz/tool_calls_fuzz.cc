// libFuzzer target for tool-call parsing (common/chat/tool_calls.h): any
// byte string, as a model turn in either format, parses to calls whose
// names are non-empty and whose count is within the limit, or fails with
// InvalidArgument; nothing throws, crashes or hangs.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/chat/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::chat::ToolCallFormat;
  const std::string_view turn(reinterpret_cast<const char*>(data), size);
  tandem::chat::ToolCallLimits limits;
  limits.max_calls = 8;
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3}) {
    auto parsed = tandem::chat::ParseToolCalls(turn, format, "c", limits);
    if (!parsed.ok()) {
      if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
        std::abort();
      }
      continue;
    }
    if (static_cast<int32_t>(parsed->calls.size()) > limits.max_calls) {
      std::abort();
    }
    for (const auto& call : parsed->calls) {
      if (call.name.empty()) std::abort();
    }
  }
  return 0;
}
