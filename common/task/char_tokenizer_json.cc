#include "common/task/char_tokenizer_json.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"

namespace tandem::task {

using Json = nlohmann::ordered_json;

Json CharAddedToken(int32_t id, const std::string& content, bool special) {
  return Json{{"id", id},          {"content", content}, {"single_word", false},
              {"lstrip", false},   {"rstrip", false},    {"normalized", false},
              {"special", special}};
}

std::string CharTokenizerJson(const std::vector<std::string>& characters,
                              const Json& added) {
  Json vocab = Json::object();
  for (size_t i = 0; i < characters.size(); ++i) {
    vocab[tokenizer::ByteLevelEncode(characters[i])] = static_cast<int32_t>(i);
  }
  for (const Json& token : added) {
    vocab[token["content"].get<std::string>()] = token["id"];
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  const Json json = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", byte_level},
                     {"post_processor", nullptr},
                     {"decoder", byte_level},
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

}  // namespace tandem::task
