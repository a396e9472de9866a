#include "common/task/tools_tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"

namespace tandem::task {
namespace {

using Json = nlohmann::ordered_json;

Json AddedToken(int32_t id, const char* content, bool special) {
  return Json{{"id", id},          {"content", content}, {"single_word", false},
              {"lstrip", false},   {"rstrip", false},    {"normalized", false},
              {"special", special}};
}

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

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path,
                                            ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ToolsTokenizerJson() {
  // Keys spelled the byte-level way (space "Ġ", newline "Ċ"), with a
  // ByteLevel pre-tokenizer: what GPT-2 style tokenizers do, so that
  // Hugging Face's loaders agree on the ids. transformers 5 loads this
  // directory as a Qwen2 tokenizer (its config is a Qwen2 model's), which
  // byte-level encodes the text before the vocabulary lookup; raw keys " "
  // and "\n" were then never found and spaces were dropped.
  Json vocab = Json::object();
  vocab[tokenizer::ByteLevelEncode("\n")] = 0;
  for (int c = ' '; c <= '~'; ++c) {
    vocab[tokenizer::ByteLevelEncode(std::string(1, static_cast<char>(c)))] =
        c - ' ' + 1;
  }
  vocab[kToolsImStartToken] = kToolsImStartId;
  vocab[kToolsImEndToken] = kToolsImEndId;
  vocab[kToolsCallOpenToken] = kToolsCallOpenId;
  vocab[kToolsCallCloseToken] = kToolsCallCloseId;
  vocab[kToolsEndOfTextToken] = kToolsEndOfTextId;
  vocab[kToolsPadToken] = kToolsPadId;
  Json added =
      Json::array({AddedToken(kToolsImStartId, kToolsImStartToken, true),
                   AddedToken(kToolsImEndId, kToolsImEndToken, true),
                   AddedToken(kToolsCallOpenId, kToolsCallOpenToken, false),
                   AddedToken(kToolsCallCloseId, kToolsCallCloseToken, false),
                   AddedToken(kToolsEndOfTextId, kToolsEndOfTextToken, true),
                   AddedToken(kToolsPadId, kToolsPadToken, true)});
  Json json = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", added},
               {"normalizer", nullptr},
               {"pre_tokenizer",
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", false},
                 {"use_regex", false}}},
               {"post_processor", nullptr},
               {"decoder",
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", false},
                 {"use_regex", false}}},
               {"model",
                {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"ignore_merges", false},
                 {"vocab", vocab},
                 {"merges", Json::array()}}}};
  return json.dump(2) + "\n";
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
