#include "common/task/arith_tokenizer.h"

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

constexpr const char* kCharacters[] = {"0", "1", "2", "3", "4", "5", "6",
                                       "7", "8", "9", "+", "-", "=", " "};

}  // namespace

std::string ArithTokenizerJson() {
  return CharTokenizerJson(
      std::vector<std::string>(std::begin(kCharacters), std::end(kCharacters)),
      nlohmann::ordered_json::array(
          {CharAddedToken(kArithBosId, kArithBosToken, true),
           CharAddedToken(kArithEosId, kArithEosToken, true),
           CharAddedToken(kArithPadId, kArithPadToken, true)}));
}

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
