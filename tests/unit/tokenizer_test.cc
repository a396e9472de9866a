// Unit tests of the tokenizer on small tokenizer.json files built here.
// Comparisons with real tokenizers are in tokenizer_reference_test.cc.

#include "common/tokenizer/tokenizer.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer {
namespace {

using Json = nlohmann::json;

// A byte-level BPE tokenizer.json: ids 0..255 are the 256 byte characters,
// then one token per merge in order, then `added`.
Json ByteLevelJson(
    const std::vector<std::pair<std::string, std::string>>& merges,
    bool pair_format, Json added = Json::array()) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[ByteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
  }
  Json merge_list = Json::array();
  for (const auto& [left, right] : merges) {
    std::string merged = left + right;
    if (!vocab.contains(merged)) vocab[merged] = vocab.size();
    if (pair_format) {
      merge_list.push_back(Json::array({left, right}));
    } else {
      merge_list.push_back(left + " " + right);
    }
  }
  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", false},
                     {"use_regex", true}};
  return Json{{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer", byte_level},
              {"post_processor", byte_level},
              {"decoder", byte_level},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merge_list}}}};
}

Json AddedToken(int id, const std::string& content, bool special,
                Json overrides = Json::object()) {
  Json token = {
      {"id", id},          {"content", content}, {"single_word", false},
      {"lstrip", false},   {"rstrip", false},    {"normalized", false},
      {"special", special}};
  token.update(overrides);
  return token;
}

std::unique_ptr<Tokenizer> Load(const Json& json) {
  auto tokenizer = Tokenizer::FromJson(json.dump(), "test.json");
  INFO(tokenizer.status().ToString());
  REQUIRE(tokenizer.ok());
  return std::move(*tokenizer);
}

std::string LoadError(const std::string& text) {
  auto tokenizer = Tokenizer::FromJson(text, "bad/tokenizer.json");
  REQUIRE_FALSE(tokenizer.ok());
  return std::string(tokenizer.status().message());
}

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"},  {"h", "e"}, {"Ġt", "he"}, {"a", "b"},
    {"ab", "c"}, {"Ġ", "Ġ"}, {"l", "l"},   {"ll", "o"}};

int32_t Id(const Tokenizer& tokenizer, const std::string& token) {
  std::optional<int32_t> id = tokenizer.TokenId(token);
  INFO("token " << token);
  REQUIRE(id.has_value());
  return *id;
}

TEST_CASE("Byte-level mapping is a bijection over all 256 bytes",
          "[tokenizer]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string encoded = ByteLevelEncode(all);
  std::optional<std::string> decoded = ByteLevelDecode(encoded);
  REQUIRE(decoded.has_value());
  CHECK(*decoded == all);
  CHECK(ByteLevelEncode(" ") == "Ġ");
  CHECK(ByteLevelEncode("\n") == "Ċ");
  CHECK(ByteLevelEncode("a") == "a");
  CHECK_FALSE(ByteLevelDecode(" ").has_value());
}

TEST_CASE("Both merges formats give the same ids", "[tokenizer]") {
  auto strings = Load(ByteLevelJson(kMerges, /*pair_format=*/false));
  auto pairs = Load(ByteLevelJson(kMerges, /*pair_format=*/true));
  const std::string text = "the abc hello  the";
  std::vector<int32_t> ids = strings->Encode(text);
  CHECK(ids == pairs->Encode(text));
  CHECK(ids == std::vector<int32_t>{Id(*strings, "t"), Id(*strings, "he"),
                                    Id(*strings, "Ġ"), Id(*strings, "abc"),
                                    Id(*strings, "Ġ"), Id(*strings, "he"),
                                    Id(*strings, "llo"), Id(*strings, "Ġ"),
                                    Id(*strings, "Ġthe")});
  CHECK(strings->Decode(ids) == text);
}

TEST_CASE("Pair-format merges may contain spaces", "[tokenizer]") {
  // Without a pre-tokenizer the raw text is one word, so the vocabulary can
  // hold a real space; only the pair format can spell merges with it.
  Json json = ByteLevelJson({}, true);
  json["pre_tokenizer"] = nullptr;
  json["model"]["vocab"][" "] = 300;
  json["model"]["vocab"]["a "] = 301;
  json["model"]["vocab"]["a b"] = 302;
  json["model"]["merges"] =
      Json::array({Json::array({"a", " "}), Json::array({"a ", "b"}),
                   Json::array({"a b", "c"})});
  json["model"]["vocab"]["a bc"] = 303;
  auto tokenizer = Load(json);
  CHECK(tokenizer->Encode("a bc") == std::vector<int32_t>{303});
  CHECK(tokenizer->Encode("a b") == std::vector<int32_t>{302});
  CHECK(tokenizer->Decode(std::vector<int32_t>{303}) == "a bc");
}

TEST_CASE("Merge order follows rank, not position", "[tokenizer]") {
  // "ab" outranks "bc": "abc" -> "ab" "c"; with the ranks swapped -> "a" "bc".
  auto ab_first = Load(ByteLevelJson({{"a", "b"}, {"b", "c"}}, false));
  auto bc_first = Load(ByteLevelJson({{"b", "c"}, {"a", "b"}}, false));
  CHECK(ab_first->Encode("abc") ==
        std::vector<int32_t>{Id(*ab_first, "ab"), 'c'});
  CHECK(bc_first->Encode("abc") ==
        std::vector<int32_t>{'a', Id(*bc_first, "bc")});
}

TEST_CASE("ignore_merges emits a whole-word vocabulary entry directly",
          "[tokenizer]") {
  Json json = ByteLevelJson({{"a", "b"}}, false);
  json["model"]["vocab"]["xyz"] = 400;
  auto plain = Load(json);
  CHECK(plain->Encode("xyz") == std::vector<int32_t>{'x', 'y', 'z'});
  json["model"]["ignore_merges"] = true;
  auto ignoring = Load(json);
  CHECK(ignoring->Encode("xyz") == std::vector<int32_t>{400});
  CHECK(ignoring->Encode("xy") == std::vector<int32_t>{'x', 'y'});
}

TEST_CASE("Added tokens match longest first, before BPE", "[tokenizer]") {
  Json added = Json::array({AddedToken(500, "<|a|>", true),
                            AddedToken(501, "<|a|><|b|>", true),
                            AddedToken(502, "<|b|>", false)});
  auto tokenizer = Load(ByteLevelJson(kMerges, false, added));
  CHECK(tokenizer->Encode("<|a|><|b|>") == std::vector<int32_t>{501});
  CHECK(tokenizer->Encode("<|a|> <|b|>") ==
        std::vector<int32_t>{500, Id(*tokenizer, "Ġ"), 502});
  CHECK(tokenizer->Encode("x<|b|>y") == std::vector<int32_t>{'x', 502, 'y'});
  CHECK(tokenizer->TokenId("<|a|>") == 500);
  CHECK(tokenizer->IsSpecial(500));
  CHECK_FALSE(tokenizer->IsSpecial(502));
  CHECK(tokenizer->vocab_size() == 503);
}

TEST_CASE("parse_special=false encodes special tokens as text", "[tokenizer]") {
  Json added = Json::array(
      {AddedToken(500, "<s>", true), AddedToken(501, "<t>", false)});
  auto tokenizer = Load(ByteLevelJson({}, false, added));
  CHECK(tokenizer->Encode("<s><t>", /*parse_special=*/false) ==
        std::vector<int32_t>{'<', 's', '>', 501});
  CHECK(tokenizer->Encode("<s><t>") == std::vector<int32_t>{500, 501});
}

TEST_CASE("Added token flags single_word, lstrip, rstrip", "[tokenizer]") {
  Json added =
      Json::array({AddedToken(500, "<w>", false, {{"single_word", true}}),
                   AddedToken(501, "<l>", true, {{"lstrip", true}}),
                   AddedToken(502, "<r>", true, {{"rstrip", true}})});
  auto tokenizer = Load(ByteLevelJson({}, false, added));
  const int32_t space = Id(*tokenizer, "Ġ");
  SECTION("single_word matches only between non-word characters") {
    CHECK(tokenizer->Encode("<w>") == std::vector<int32_t>{500});
    CHECK(tokenizer->Encode("a <w> b") ==
          std::vector<int32_t>{'a', space, 500, space, 'b'});
    CHECK(tokenizer->Encode("a<w>") ==
          std::vector<int32_t>{'a', '<', 'w', '>'});
    CHECK(tokenizer->Encode("<w>_") ==
          std::vector<int32_t>{'<', 'w', '>', '_'});
  }
  SECTION("lstrip absorbs whitespace on the left") {
    CHECK(tokenizer->Encode("a  \t<l> b") ==
          std::vector<int32_t>{'a', 501, space, 'b'});
  }
  SECTION("rstrip absorbs whitespace on the right") {
    CHECK(tokenizer->Encode("a <r> \n b") ==
          std::vector<int32_t>{'a', space, 502, 'b'});
  }
}

TEST_CASE("Normalized added tokens match after NFC", "[tokenizer]") {
  // "é" written decomposed in the text matches the composed token only
  // after normalization.
  Json added = Json::array(
      {AddedToken(500, "caf\xC3\xA9", false, {{"normalized", true}})});
  auto tokenizer = Load(ByteLevelJson({}, false, added));
  CHECK(tokenizer->Encode("cafe\xCC\x81") == std::vector<int32_t>{500});
  CHECK(tokenizer->Decode(tokenizer->Encode("cafe\xCC\x81")) == "caf\xC3\xA9");
}

TEST_CASE("Decode skips special tokens on request", "[tokenizer]") {
  Json added = Json::array({AddedToken(500, "<|eos|>", true)});
  auto tokenizer = Load(ByteLevelJson(kMerges, false, added));
  std::vector<int32_t> ids = tokenizer->Encode("the<|eos|>");
  CHECK(tokenizer->Decode(ids) == "the<|eos|>");
  CHECK(tokenizer->Decode(ids, /*skip_special=*/true) == "the");
  CHECK(tokenizer->Decode(std::vector<int32_t>{-1, 99999, 't'}) == "t");
}

TEST_CASE("Tokens that are not valid UTF-8 alone decode to raw bytes",
          "[tokenizer]") {
  auto tokenizer = Load(ByteLevelJson({}, false));
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  std::vector<int32_t> ids = tokenizer->Encode(emoji);
  REQUIRE(ids.size() == 4);
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(tokenizer->TokenBytes(ids[i]) == emoji.substr(i, 1));
    joined += tokenizer->TokenBytes(ids[i]);
  }
  CHECK(joined == emoji);
  CHECK(tokenizer->Decode(std::vector<int32_t>(ids.begin(), ids.begin() + 2)) ==
        emoji.substr(0, 2));
  CHECK(tokenizer->Decode(ids) == emoji);
}

TEST_CASE("Invalid UTF-8 input round-trips byte for byte", "[tokenizer]") {
  auto tokenizer = Load(ByteLevelJson(kMerges, false));
  const std::string text = "ok \xFF\xFE the \xC3 end\x80";
  CHECK(tokenizer->Decode(tokenizer->Encode(text)) == text);
}

TEST_CASE("Random bytes round-trip through a byte-level tokenizer",
          "[tokenizer]") {
  Json json = ByteLevelJson(kMerges, false,
                            Json::array({AddedToken(500, "<|x|>", true)}));
  json["normalizer"] = nullptr;
  auto tokenizer = Load(json);
  std::mt19937 rng(12345);
  const std::string alphabet = std::string("ab th\n\t<|x|>\xC3\xA9\xF0\x9F") +
                               std::string(1, '\0') + "\x80\xFF";
  for (int i = 0; i < 500; ++i) {
    std::string text;
    const int length = static_cast<int>(rng() % 64);
    for (int j = 0; j < length; ++j) {
      text.push_back(rng() % 4 == 0 ? static_cast<char>(rng() % 256)
                                    : alphabet[rng() % alphabet.size()]);
    }
    INFO("case " << i);
    CHECK(tokenizer->Decode(tokenizer->Encode(text)) == text);
  }
}

// The tokenizer.json that the built-in arithmetic task writes: a BPE model
// with no merges over single characters, no pre-tokenizer, ByteLevel
// decoder. Hugging Face's tokenizers loads the same file (see tokenizer.h).
Json CharLevelJson() {
  Json vocab = Json::object();
  int id = 0;
  for (const char* c :
       {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "-", "=", " "}) {
    vocab[c] = id++;
  }
  Json added = Json::array();
  for (const char* special : {"<|bos|>", "<|eos|>", "<|pad|>"}) {
    vocab[special] = id;
    added.push_back(AddedToken(id++, special, true));
  }
  return Json{{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
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
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", Json::array()}}}};
}

TEST_CASE("Character-level tokenizer encodes one id per character",
          "[tokenizer]") {
  auto tokenizer = Load(CharLevelJson());
  CHECK(tokenizer->vocab_size() == 17);
  std::vector<int32_t> ids = tokenizer->Encode("<|bos|>12 + 34 = 46<|eos|>");
  CHECK(ids ==
        std::vector<int32_t>{14, 1, 2, 13, 10, 13, 3, 4, 13, 12, 13, 4, 6, 15});
  CHECK(tokenizer->Decode(ids) == "<|bos|>12 + 34 = 46<|eos|>");
  CHECK(tokenizer->Decode(ids, /*skip_special=*/true) == "12 + 34 = 46");
  CHECK(tokenizer->TokenBytes(13) == " ");
  CHECK(tokenizer->Encode("-7") == std::vector<int32_t>{11, 7});
  // Characters outside the vocabulary produce no ids (no unk_token).
  CHECK(tokenizer->Encode("1x2") == std::vector<int32_t>{1, 2});
}

TEST_CASE("Character-level tokenizer in byte-level spelling gives the same ids",
          "[tokenizer]") {
  // The variant that transformers.js decodes correctly too: the space is
  // spelled "Ġ" and a ByteLevel pre-tokenizer (no regex) maps the input.
  Json json = CharLevelJson();
  json["model"]["vocab"].erase(" ");
  json["model"]["vocab"]["Ġ"] = 13;
  json["pre_tokenizer"] = json["decoder"];
  auto byte_level = Load(json);
  auto plain = Load(CharLevelJson());
  const std::string text = "<|bos|>12 + 34 = 46<|eos|>";
  CHECK(byte_level->Encode(text) == plain->Encode(text));
  CHECK(byte_level->Decode(byte_level->Encode(text)) == text);
}

TEST_CASE("Character-level tokenizer with unk_token maps unknown characters",
          "[tokenizer]") {
  Json json = CharLevelJson();
  json["model"]["vocab"]["?"] = 17;
  json["model"]["unk_token"] = "?";
  json["model"]["fuse_unk"] = true;
  auto tokenizer = Load(json);
  CHECK(tokenizer->Encode("1xy2z") == std::vector<int32_t>{1, 17, 2, 17});
}

TEST_CASE("Character-level tokenizer loads from a file", "[tokenizer]") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("tandem_char_tokenizer_" + std::to_string(::getpid()) + ".json"))
          .string();
  {
    std::ofstream out(path);
    out << CharLevelJson().dump(2);
  }
  auto tokenizer = Tokenizer::FromFile(path);
  std::remove(path.c_str());
  REQUIRE(tokenizer.ok());
  CHECK((*tokenizer)->Encode("9=9") == std::vector<int32_t>{9, 12, 9});
}

TEST_CASE("Malformed or unsupported tokenizer.json fails with the field path",
          "[tokenizer]") {
  Json good = ByteLevelJson(kMerges, false);
  SECTION("not JSON") {
    std::string message = LoadError("{\"model\": ");
    CHECK_THAT(message, Catch::Contains("bad/tokenizer.json: malformed JSON"));
  }
  SECTION("missing file") {
    auto tokenizer = Tokenizer::FromFile("/nonexistent/tokenizer.json");
    REQUIRE_FALSE(tokenizer.ok());
    CHECK_THAT(std::string(tokenizer.status().message()),
               Catch::Contains("/nonexistent/tokenizer.json"));
  }
  SECTION("WordPiece model") {
    good["model"]["type"] = "WordPiece";
    CHECK(LoadError(good.dump()) ==
          "bad/tokenizer.json: model.type: unsupported model type "
          "\"WordPiece\" (supported: BPE)");
  }
  SECTION("Unigram model") {
    good["model"]["type"] = "Unigram";
    CHECK_THAT(LoadError(good.dump()), Catch::Contains("\"Unigram\""));
  }
  SECTION("unsupported normalizer inside a Sequence") {
    good["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         Json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("normalizer.normalizers[1].type: unsupported "
                               "normalizer \"Lowercase\""));
  }
  SECTION("unsupported pre-tokenizer") {
    good["pre_tokenizer"] = {{"type", "Metaspace"}};
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("pre_tokenizer.type: unsupported pre-tokenizer "
                               "\"Metaspace\""));
  }
  SECTION("invalid split regex") {
    good["pre_tokenizer"] = {{"type", "Split"},
                             {"pattern", {{"Regex", "(unclosed"}}},
                             {"behavior", "Isolated"},
                             {"invert", false}};
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("pre_tokenizer.pattern.Regex: cannot compile"));
  }
  SECTION("unsupported split behavior") {
    good["pre_tokenizer"] = {{"type", "Split"},
                             {"pattern", {{"String", " "}}},
                             {"behavior", "MergedWithNext"},
                             {"invert", false}};
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("pre_tokenizer.behavior: unsupported split "
                               "behavior \"MergedWithNext\""));
  }
  SECTION("unsupported decoder") {
    good["decoder"] = {{"type", "WordPiece"}};
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("decoder.type: unsupported decoder"));
  }
  SECTION("merge of a token not in the vocabulary") {
    good["model"]["merges"].push_back("q zz");
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("model.merges[8]: token \"zz\" is not in the "
                               "vocabulary"));
  }
  SECTION("merge string without a separator") {
    good["model"]["merges"][2] = "abc";
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("model.merges[2]: expected \"left right\""));
  }
  SECTION("negative vocabulary id") {
    good["model"]["vocab"]["x"] = -3;
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("model.vocab[\"x\"]: expected a token id"));
  }
  SECTION("vocab is not an object") {
    good["model"]["vocab"] = Json::array();
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("model.vocab: expected an object"));
  }
  SECTION("added token without content") {
    good["added_tokens"] = Json::array({{{"id", 5}}});
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("added_tokens[0].content"));
  }
  SECTION("byte_fallback") {
    good["model"]["byte_fallback"] = true;
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("model.byte_fallback: unsupported value true"));
  }
  SECTION("missing model") {
    good.erase("model");
    CHECK(LoadError(good.dump()) == "bad/tokenizer.json: model: missing");
  }
  SECTION("unk_token not in vocabulary") {
    good["model"]["unk_token"] = "<unk>";
    CHECK_THAT(LoadError(good.dump()),
               Catch::Contains("model.unk_token: \"<unk>\" is not in the "
                               "vocabulary"));
  }
}

TEST_CASE("Concurrent Encode and Decode agree with serial results",
          "[tokenizer]") {
  auto tokenizer = Load(ByteLevelJson(kMerges, false));
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("the abc " + std::to_string(i * 7919) + " hello\n");
  }
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& text : texts) {
    expected.push_back(tokenizer->Encode(text));
  }
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          std::vector<int32_t> ids = tokenizer->Encode(texts[i]);
          if (ids != expected[i] || tokenizer->Decode(ids) != texts[i]) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failures == std::vector<int>(4, 0));
}

}  // namespace
}  // namespace tandem::tokenizer
