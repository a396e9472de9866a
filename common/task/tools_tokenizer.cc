#include "common/task/tools_tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/task/char_tokenizer_json.h"

namespace tandem::task {
namespace {

using Json = nlohmann::ordered_json;

// Tool messages are their own ChatML turn (role "tool"), shorter for a
// character-level model than Qwen2.5's <tool_response> blocks. An
// assistant message's tool_calls render as Qwen2.5 writes them, without its
// newlines: <tool_call>{"name": "...", "arguments": {...}}</tool_call>
// (`tojson` with Python's default separators), which is ToolsCallTurn.
constexpr char kChatTemplate[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}";


}  // namespace

std::string ToolsTokenizerJson() {
  std::vector<std::string> characters = {"\n"};
  for (char c = ' '; c <= '~'; ++c) characters.emplace_back(1, c);
  return CharTokenizerJson(
      characters,
      nlohmann::ordered_json::array(
          {CharAddedToken(kToolsImStartId, kToolsImStartToken, true),
           CharAddedToken(kToolsImEndId, kToolsImEndToken, true),
           CharAddedToken(kToolsCallOpenId, kToolsCallOpenToken, false),
           CharAddedToken(kToolsCallCloseId, kToolsCallCloseToken, false),
           CharAddedToken(kToolsEndOfTextId, kToolsEndOfTextToken, true),
           CharAddedToken(kToolsPadId, kToolsPadToken, true)}));
}

std::string ToolsChatTemplate() { return kChatTemplate; }

std::string ToolsTokenizerConfigJson() {
  const Json json = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                     {"bos_token", nullptr},
                     {"eos_token", kToolsImEndToken},
                     {"pad_token", kToolsPadToken},
                     {"clean_up_tokenization_spaces", false},
                     {"chat_template", ToolsChatTemplate()}};
  return json.dump(2) + "\n";
}

absl::Status WriteToolsTokenizerFiles(const std::string& dir) {
  RETURN_IF_ERROR(
      WriteFileAtomically(dir + "/tokenizer.json", ToolsTokenizerJson()));
  return WriteFileAtomically(dir + "/tokenizer_config.json",
                             ToolsTokenizerConfigJson());
}

absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadToolsTokenizer() {
  return tokenizer::Tokenizer::FromJson(ToolsTokenizerJson(),
                                        "<tools tokenizer.json>");
}

}  // namespace tandem::task
