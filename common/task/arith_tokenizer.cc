#include "common/task/arith_tokenizer.h"

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

constexpr const char* kCharacters[] = {"0", "1", "2", "3", "4", "5", "6",
                                       "7", "8", "9", "+", "-", "=", " "};

Json AddedToken(int32_t id, const char* content) {
  return Json{{"id", id},        {"content", content}, {"single_word", false},
              {"lstrip", false}, {"rstrip", false},    {"normalized", false},
              {"special", true}};
}

}  // namespace

std::string ArithTokenizerJson() {
  Json vocab = Json::object();
  int32_t id = 0;
  // Keys spelled the byte-level way (the space is "Ġ") with a ByteLevel
  // pre-tokenizer, as tools_tokenizer.cc does: transformers 5 loads the
  // directory as a Qwen2 tokenizer, which dropped a raw " " key.
  for (const char* c : kCharacters) vocab[tokenizer::ByteLevelEncode(c)] = id++;
  vocab[kArithBosToken] = kArithBosId;
  vocab[kArithEosToken] = kArithEosId;
  vocab[kArithPadToken] = kArithPadId;
  Json added = Json::array({AddedToken(kArithBosId, kArithBosToken),
                            AddedToken(kArithEosId, kArithEosToken),
                            AddedToken(kArithPadId, kArithPadToken)});
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

namespace {

// Replaces `path` with `text` through a temporary file in its directory.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    }
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

absl::Status WriteArithTokenizer(const std::string& path) {
  return WriteFileAtomically(path, ArithTokenizerJson());
}

std::string ArithTokenizerConfigJson() {
  const Json json = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                     {"bos_token", kArithBosToken},
                     {"eos_token", kArithEosToken},
                     {"pad_token", kArithPadToken},
                     {"clean_up_tokenization_spaces", false}};
  return json.dump(2) + "\n";
}

absl::Status WriteArithTokenizerFiles(const std::string& dir) {
  RETURN_IF_ERROR(WriteArithTokenizer(dir + "/tokenizer.json"));
  return WriteFileAtomically(dir + "/tokenizer_config.json",
                             ArithTokenizerConfigJson());
}

absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadArithTokenizer() {
  return tokenizer::Tokenizer::FromJson(ArithTokenizerJson(),
                                        "<arith tokenizer.json>");
}

}  // namespace tandem::task
