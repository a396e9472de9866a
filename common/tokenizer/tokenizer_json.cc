#include "common/tokenizer/tokenizer_json.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer {
namespace {

using Json = nlohmann::json;

// A short rendering of a JSON value for error messages.
std::string Describe(const Json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/false,
                                Json::error_handler_t::replace);
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

class SpecParser {
 public:
  explicit SpecParser(absl::string_view source) : source_(source) {}

  absl::StatusOr<TokenizerSpec> Parse(const Json& root) {
    if (!root.is_object()) {
      return Invalid(
          "(root)", absl::StrCat("expected an object, got ", root.type_name()));
    }
    TokenizerSpec spec;
    RETURN_IF_ERROR(
        ParseNormalizer(Field(root, "normalizer"), "normalizer", &spec));
    RETURN_IF_ERROR(ParsePreTokenizer(Field(root, "pre_tokenizer"),
                                      "pre_tokenizer", &spec.pre_tokenizer));
    RETURN_IF_ERROR(ParseModel(root, &spec));
    RETURN_IF_ERROR(ParseAddedTokens(Field(root, "added_tokens"), &spec));
    RETURN_IF_ERROR(ParseDecoder(Field(root, "decoder"), &spec));
    return spec;
  }

 private:
  static const Json& Null() {
    static const Json* const null = new Json(nullptr);
    return *null;
  }

  // The member `key` of object `obj`, or null when absent.
  static const Json& Field(const Json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? Null() : *it;
  }

  absl::Status Invalid(absl::string_view path, absl::string_view message) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": ", path, ": ", message));
  }

  absl::Status Unsupported(absl::string_view path, absl::string_view what,
                           const Json& value, absl::string_view supported) {
    return absl::UnimplementedError(
        absl::StrCat(source_, ": ", path, ": unsupported ", what, " ",
                     Describe(value), " (supported: ", supported, ")"));
  }

  absl::Status ExpectObject(const Json& value, absl::string_view path) {
    if (value.is_object()) return absl::OkStatus();
    return Invalid(path, absl::StrCat("expected an object, got ",
                                      value.type_name(), " ", Describe(value)));
  }

  absl::StatusOr<std::string> TypeOf(const Json& obj, absl::string_view path) {
    RETURN_IF_ERROR(ExpectObject(obj, path));
    const Json& type = Field(obj, "type");
    if (!type.is_string()) {
      return Invalid(absl::StrCat(path, ".type"),
                     absl::StrCat("expected a string, got ", Describe(type)));
    }
    return type.get<std::string>();
  }

  absl::StatusOr<bool> Bool(const Json& obj, const char* key,
                            absl::string_view path, bool default_value) {
    const Json& value = Field(obj, key);
    if (value.is_null()) return default_value;
    if (!value.is_boolean()) {
      return Invalid(absl::StrCat(path, ".", key),
                     absl::StrCat("expected a boolean, got ", Describe(value)));
    }
    return value.get<bool>();
  }

  absl::StatusOr<std::optional<std::string>> OptionalString(
      const Json& obj, const char* key, absl::string_view path) {
    const Json& value = Field(obj, key);
    if (value.is_null()) return std::optional<std::string>();
    if (!value.is_string()) {
      return Invalid(absl::StrCat(path, ".", key),
                     absl::StrCat("expected a string, got ", Describe(value)));
    }
    return std::optional<std::string>(value.get<std::string>());
  }

  absl::StatusOr<int32_t> TokenIdValue(const Json& value,
                                       absl::string_view path) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > kMaxTokenId) {
      return Invalid(path,
                     absl::StrCat("expected a token id in [0, ", kMaxTokenId,
                                  "], got ", Describe(value)));
    }
    return static_cast<int32_t>(value.get<int64_t>());
  }

  absl::Status ParseNormalizer(const Json& value, const std::string& path,
                               TokenizerSpec* spec) {
    if (value.is_null()) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::string type, TypeOf(value, path));
    if (type == "NFC") {
      spec->nfc = true;
      return absl::OkStatus();
    }
    if (type == "Sequence") {
      const Json& members = Field(value, "normalizers");
      if (!members.is_array()) {
        return Invalid(
            absl::StrCat(path, ".normalizers"),
            absl::StrCat("expected an array, got ", Describe(members)));
      }
      for (size_t i = 0; i < members.size(); ++i) {
        RETURN_IF_ERROR(ParseNormalizer(
            members[i], absl::StrCat(path, ".normalizers[", i, "]"), spec));
      }
      return absl::OkStatus();
    }
    return Unsupported(absl::StrCat(path, ".type"), "normalizer",
                       Field(value, "type"), "null, NFC, Sequence of NFC");
  }

  absl::Status ParsePreTokenizer(const Json& value, const std::string& path,
                                 std::vector<PreTokenizerStep>* steps) {
    if (value.is_null()) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::string type, TypeOf(value, path));
    if (type == "Sequence") {
      const Json& members = Field(value, "pretokenizers");
      if (!members.is_array()) {
        return Invalid(
            absl::StrCat(path, ".pretokenizers"),
            absl::StrCat("expected an array, got ", Describe(members)));
      }
      for (size_t i = 0; i < members.size(); ++i) {
        RETURN_IF_ERROR(ParsePreTokenizer(
            members[i], absl::StrCat(path, ".pretokenizers[", i, "]"), steps));
      }
      return absl::OkStatus();
    }
    PreTokenizerStep step;
    if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::Kind::kByteLevel;
      ASSIGN_OR_RETURN(step.add_prefix_space,
                       Bool(value, "add_prefix_space", path, true));
      ASSIGN_OR_RETURN(bool use_regex, Bool(value, "use_regex", path, true));
      if (use_regex) {
        ASSIGN_OR_RETURN(step.regex,
                         CompileRegex(kGpt2SplitPattern, false, path));
      }
      steps->push_back(std::move(step));
      return absl::OkStatus();
    }
    if (type == "Split") {
      step.kind = PreTokenizerStep::Kind::kSplit;
      const Json& pattern = Field(value, "pattern");
      std::string pattern_path = absl::StrCat(path, ".pattern");
      RETURN_IF_ERROR(ExpectObject(pattern, pattern_path));
      const Json& regex = Field(pattern, "Regex");
      const Json& literal = Field(pattern, "String");
      if (regex.is_string()) {
        ASSIGN_OR_RETURN(step.regex,
                         CompileRegex(regex.get<std::string>(), false,
                                      absl::StrCat(pattern_path, ".Regex")));
      } else if (literal.is_string()) {
        ASSIGN_OR_RETURN(step.regex,
                         CompileRegex(literal.get<std::string>(), true,
                                      absl::StrCat(pattern_path, ".String")));
      } else {
        return Invalid(pattern_path,
                       absl::StrCat("expected {\"Regex\": string} or "
                                    "{\"String\": string}, got ",
                                    Describe(pattern)));
      }
      const Json& behavior = Field(value, "behavior");
      if (behavior == "Isolated") {
        step.keep_gaps = true;
      } else if (behavior == "Removed") {
        step.keep_gaps = false;
      } else {
        return Unsupported(absl::StrCat(path, ".behavior"), "split behavior",
                           behavior, "Isolated, Removed");
      }
      ASSIGN_OR_RETURN(bool invert, Bool(value, "invert", path, false));
      if (invert) {
        return Unsupported(absl::StrCat(path, ".invert"), "value", Json(true),
                           "false");
      }
      steps->push_back(std::move(step));
      return absl::OkStatus();
    }
    return Unsupported(absl::StrCat(path, ".type"), "pre-tokenizer",
                       Field(value, "type"),
                       "null, ByteLevel, Split, Sequence of these");
  }

  absl::StatusOr<std::shared_ptr<const RegexSplitter>> CompileRegex(
      const std::string& pattern, bool literal, absl::string_view path) {
    absl::StatusOr<std::unique_ptr<RegexSplitter>> regex =
        RegexSplitter::Create(pattern, literal);
    if (!regex.ok()) return Invalid(path, regex.status().message());
    return std::shared_ptr<const RegexSplitter>(std::move(*regex));
  }

  absl::Status ParseModel(const Json& root, TokenizerSpec* spec) {
    const Json& model = Field(root, "model");
    if (model.is_null()) return Invalid("model", "missing");
    ASSIGN_OR_RETURN(std::string type, TypeOf(model, "model"));
    if (type != "BPE") {
      return Unsupported("model.type", "model type", Field(model, "type"),
                         "BPE");
    }
    if (!Field(model, "dropout").is_null()) {
      return Unsupported("model.dropout", "value", Field(model, "dropout"),
                         "null");
    }
    ASSIGN_OR_RETURN(bool byte_fallback,
                     Bool(model, "byte_fallback", "model", false));
    if (byte_fallback) {
      return Unsupported("model.byte_fallback", "value", Json(true), "false");
    }
    for (const char* key :
         {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const Json& affix = Field(model, key);
      if (!affix.is_null() && affix != "") {
        return Unsupported(absl::StrCat("model.", key), "value", affix,
                           "null or \"\"");
      }
    }
    ASSIGN_OR_RETURN(spec->bpe_options.unk_token,
                     OptionalString(model, "unk_token", "model"));
    ASSIGN_OR_RETURN(spec->bpe_options.fuse_unk,
                     Bool(model, "fuse_unk", "model", false));
    ASSIGN_OR_RETURN(spec->bpe_options.ignore_merges,
                     Bool(model, "ignore_merges", "model", false));

    const Json& vocab = Field(model, "vocab");
    RETURN_IF_ERROR(ExpectObject(vocab, "model.vocab"));
    spec->vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      ASSIGN_OR_RETURN(int32_t id,
                       TokenIdValue(it.value(), absl::StrCat("model.vocab[\"",
                                                             it.key(), "\"]")));
      spec->vocab[it.key()] = id;
    }

    const Json& merges = Field(model, "merges");
    if (merges.is_null()) return absl::OkStatus();
    if (!merges.is_array()) {
      return Invalid("model.merges", absl::StrCat("expected an array, got ",
                                                  merges.type_name()));
    }
    spec->merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const Json& merge = merges[i];
      if (merge.is_string()) {
        // "a b": exactly one space separates the two tokens.
        const std::string& text = merge.get_ref<const std::string&>();
        size_t space = text.find(' ');
        if (space == std::string::npos ||
            text.find(' ', space + 1) != std::string::npos) {
          return Invalid(
              absl::StrCat("model.merges[", i, "]"),
              absl::StrCat("expected \"left right\", got ", Describe(merge)));
        }
        spec->merges.emplace_back(text.substr(0, space),
                                  text.substr(space + 1));
      } else if (merge.is_array() && merge.size() == 2 &&
                 merge[0].is_string() && merge[1].is_string()) {
        spec->merges.emplace_back(merge[0].get<std::string>(),
                                  merge[1].get<std::string>());
      } else {
        return Invalid(absl::StrCat("model.merges[", i, "]"),
                       absl::StrCat("expected \"left right\" or [left, "
                                    "right], got ",
                                    Describe(merge)));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseAddedTokens(const Json& value, TokenizerSpec* spec) {
    if (value.is_null()) return absl::OkStatus();
    if (!value.is_array()) {
      return Invalid("added_tokens", absl::StrCat("expected an array, got ",
                                                  value.type_name()));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      std::string path = absl::StrCat("added_tokens[", i, "]");
      const Json& entry = value[i];
      RETURN_IF_ERROR(ExpectObject(entry, path));
      AddedToken token;
      ASSIGN_OR_RETURN(token.id, TokenIdValue(Field(entry, "id"),
                                              absl::StrCat(path, ".id")));
      const Json& content = Field(entry, "content");
      if (!content.is_string() ||
          content.get_ref<const std::string&>().empty()) {
        return Invalid(absl::StrCat(path, ".content"),
                       absl::StrCat("expected a non-empty string, got ",
                                    Describe(content)));
      }
      token.content = content.get<std::string>();
      ASSIGN_OR_RETURN(token.special, Bool(entry, "special", path, false));
      ASSIGN_OR_RETURN(token.single_word,
                       Bool(entry, "single_word", path, false));
      ASSIGN_OR_RETURN(token.lstrip, Bool(entry, "lstrip", path, false));
      ASSIGN_OR_RETURN(token.rstrip, Bool(entry, "rstrip", path, false));
      ASSIGN_OR_RETURN(token.normalized,
                       Bool(entry, "normalized", path, !token.special));
      spec->added_tokens.push_back(std::move(token));
    }
    return absl::OkStatus();
  }

  absl::Status ParseDecoder(const Json& value, TokenizerSpec* spec) {
    if (value.is_null()) {
      spec->decoder = DecoderKind::kNone;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::string type, TypeOf(value, "decoder"));
    if (type == "ByteLevel") {
      spec->decoder = DecoderKind::kByteLevel;
      return absl::OkStatus();
    }
    return Unsupported("decoder.type", "decoder", Field(value, "type"),
                       "null, ByteLevel");
  }

  const std::string source_;
};

}  // namespace

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(
    absl::string_view json, absl::string_view source_name) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": malformed JSON: ", e.what()));
  }
  return SpecParser(source_name).Parse(root);
}

}  // namespace tandem::tokenizer
