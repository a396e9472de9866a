// Compares our ids with reference ids that JavaScript tokenizers produce for
// tokenizer_reference/corpus.txt (see tokenizer_reference/reference.mjs):
// Qwen3's real tokenizer.json (array merges, Split regex + ByteLevel, NFC,
// special tokens) and GPT-2's real vocabulary (string merges, ByteLevel
// regex). The ctest fixture tokenizer_reference_setup provides the files
// through environment variables.

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace tandem::tokenizer {
namespace {

using Json = nlohmann::json;

std::string RequireEnv(const char* name) {
  const char* value = std::getenv(name);
  INFO(name << " is not set; run through ctest so that the fixture "
               "tokenizer_reference_setup provides it");
  REQUIRE(value != nullptr);
  return value;
}

std::vector<Json> ReadReference() {
  std::string path = RequireEnv("TANDEM_TOKENIZER_REFERENCE_JSONL");
  std::ifstream in(path);
  INFO("cannot open " << path);
  REQUIRE(in.good());
  std::vector<Json> records;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) records.push_back(Json::parse(line));
  }
  REQUIRE(records.size() > 10);
  return records;
}

std::unique_ptr<Tokenizer> LoadFromEnv(const char* name) {
  std::string path = RequireEnv(name);
  auto tokenizer = Tokenizer::FromFile(path);
  INFO(tokenizer.status().ToString());
  REQUIRE(tokenizer.ok());
  return std::move(*tokenizer);
}

// Compares every record's ids and round trip; reports how many matched.
void CompareWithReference(const Tokenizer& tokenizer, const char* key,
                          bool parse_special, const char* expected_text_key) {
  std::vector<Json> records = ReadReference();
  size_t matched = 0;
  size_t round_trips = 0;
  for (const Json& record : records) {
    const std::string text = record["text"].get<std::string>();
    const std::vector<int32_t> expected =
        record[key].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tokenizer.Encode(text, parse_special);
    INFO(key << " record " << record["index"] << ": " << text);
    CHECK(ids == expected);
    if (ids == expected) ++matched;
    const std::string decoded = tokenizer.Decode(ids);
    CHECK(decoded == record[expected_text_key].get<std::string>());
    if (decoded == record[expected_text_key].get<std::string>()) {
      ++round_trips;
    }
  }
  WARN(key << ": " << matched << "/" << records.size()
           << " corpus records match the reference ids, " << round_trips << "/"
           << records.size() << " round-trip");
}

TEST_CASE("Qwen3 ids match the reference for every corpus line",
          "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_QWEN3_TOKENIZER_JSON");
  CHECK(tokenizer->vocab_size() == 151669);
  CHECK(tokenizer->TokenId("<|im_start|>") == 151644);
  CHECK(tokenizer->IsSpecial(151644));
  // NFC normalization: decode gives back the composed text.
  CompareWithReference(*tokenizer, "qwen3", /*parse_special=*/true, "nfc");
}

TEST_CASE("GPT-2 ids (string merges) match the reference for every line",
          "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_GPT2_TOKENIZER_JSON");
  CHECK(tokenizer->vocab_size() == 50257);
  // gpt-3-encoder has no special tokens: "<|endoftext|>" is plain text.
  CompareWithReference(*tokenizer, "gpt2", /*parse_special=*/false, "text");
}

TEST_CASE(
    "Qwen3 splits multi-byte characters into tokens that decode only "
    "together",
    "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_QWEN3_TOKENIZER_JSON");
  const std::string text = "\xF0\x9F\xA7\x91\xE2\x80\x8D\xF0\x9F\x9A\x80";
  std::vector<int32_t> ids = tokenizer->Encode(text);
  bool some_token_is_partial = false;
  std::string joined;
  for (int32_t id : ids) {
    std::string bytes = tokenizer->TokenBytes(id);
    joined += bytes;
    // A token that starts or ends inside a character.
    if ((static_cast<unsigned char>(bytes.front()) & 0xC0) == 0x80 ||
        (static_cast<unsigned char>(bytes.back()) & 0xC0) == 0xC0) {
      some_token_is_partial = true;
    }
  }
  CHECK(some_token_is_partial);
  CHECK(joined == text);
  CHECK(tokenizer->Decode(ids) == text);
}

// Hidden: ctest does not run it. Measures single-thread encode throughput:
//   tokenizer_test "[.bench]" (with the fixture's environment variables).
TEST_CASE("Qwen3 encode throughput", "[.bench]") {
  auto tokenizer = LoadFromEnv("TANDEM_QWEN3_TOKENIZER_JSON");
  std::string corpus;
  for (const Json& record : ReadReference()) {
    corpus += record["text"].get<std::string>();
    corpus += "\n";
  }
  const int kRounds = 200;
  size_t tokens = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) tokens += tokenizer->Encode(corpus).size();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  double megabytes = static_cast<double>(corpus.size()) * kRounds / 1e6;
  WARN("encoded " << megabytes << " MB (" << tokens << " tokens) in " << seconds
                  << " s: " << megabytes / seconds << " MB/s, "
                  << tokens / seconds << " tokens/s");
}

}  // namespace
}  // namespace tandem::tokenizer
