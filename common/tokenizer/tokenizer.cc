#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/normalizer.h"

namespace tandem::tokenizer {
namespace {

constexpr uint8_t kAssigned = 1;
constexpr uint8_t kSpecial = 2;
constexpr uint8_t kAdded = 4;

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(
    const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open tokenizer file"));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": read error"));
  }
  return FromJson(contents.str(), path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view json, absl::string_view source_name) {
  ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(json, source_name));
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  tokenizer->source_name_ = std::string(source_name);
  tokenizer->nfc_ = spec.nfc;
  tokenizer->pre_tokenizer_ = PreTokenizer(std::move(spec.pre_tokenizer));
  tokenizer->decoder_ = spec.decoder;

  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& token : spec.added_tokens) {
    max_id = std::max(max_id, token.id);
  }
  const size_t size = static_cast<size_t>(max_id + 1);
  tokenizer->token_strings_.resize(size);
  tokenizer->token_flags_.resize(size, 0);
  for (const auto& [token, id] : spec.vocab) {
    tokenizer->token_strings_[id] = token;
    tokenizer->token_flags_[id] = kAssigned;
  }

  std::vector<AddedToken> raw_tokens;
  std::vector<AddedToken> normalized_tokens;
  for (AddedToken& token : spec.added_tokens) {
    tokenizer->token_strings_[token.id] = token.content;
    tokenizer->token_flags_[token.id] =
        kAssigned | kAdded | (token.special ? kSpecial : 0);
    tokenizer->added_ids_[token.content] = token.id;
    (token.normalized ? normalized_tokens : raw_tokens)
        .push_back(std::move(token));
  }
  tokenizer->raw_added_ = AddedTokenMatcher(std::move(raw_tokens));
  tokenizer->normalized_added_ =
      AddedTokenMatcher(std::move(normalized_tokens));

  tokenizer->token_bytes_.resize(size);
  for (size_t id = 0; id < size; ++id) {
    const std::string& token = tokenizer->token_strings_[id];
    std::optional<std::string> bytes;
    if (tokenizer->decoder_ == DecoderKind::kByteLevel &&
        (tokenizer->token_flags_[id] & kAdded) == 0) {
      bytes = ByteLevelDecode(token);
    }
    tokenizer->token_bytes_[id] = bytes.has_value() ? *bytes : token;
  }

  absl::StatusOr<std::unique_ptr<BpeModel>> model = BpeModel::Create(
      std::move(spec.vocab), spec.merges, std::move(spec.bpe_options));
  if (!model.ok()) {
    return absl::Status(
        model.status().code(),
        absl::StrCat(source_name, ": model.", model.status().message()));
  }
  tokenizer->model_ = std::move(*model);
  return tokenizer;
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text,
                                       bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<TextSegment> raw_segments;
  raw_added_.Split(text, parse_special, &raw_segments);
  std::vector<TextSegment> normalized_segments;
  for (const TextSegment& segment : raw_segments) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
      continue;
    }
    std::string normalized =
        nfc_ ? NfcNormalize(segment.text) : std::string(segment.text);
    if (normalized_added_.empty()) {
      EncodePlain(normalized, &ids);
      continue;
    }
    normalized_segments.clear();
    normalized_added_.Split(normalized, parse_special, &normalized_segments);
    for (const TextSegment& piece : normalized_segments) {
      if (piece.token_id >= 0) {
        ids.push_back(piece.token_id);
      } else {
        EncodePlain(piece.text, &ids);
      }
    }
  }
  return ids;
}

void Tokenizer::EncodePlain(absl::string_view text,
                            std::vector<int32_t>* ids) const {
  std::vector<std::string> words;
  pre_tokenizer_.Run(text, &words);
  for (const std::string& word : words) model_->EncodeWord(word, ids);
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids,
                              bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= token_bytes_.size()) continue;
    uint8_t flags = token_flags_[id];
    if ((flags & kAssigned) == 0) continue;
    if (skip_special && (flags & kSpecial) != 0) continue;
    if (decoder_ == DecoderKind::kNone && !first) out.push_back(' ');
    out.append(token_bytes_[id]);
    first = false;
  }
  return out;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= token_bytes_.size()) return "";
  return token_bytes_[id];
}

std::optional<std::string> Tokenizer::TokenString(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= token_strings_.size() ||
      (token_flags_[id] & kAssigned) == 0) {
    return std::nullopt;
  }
  return token_strings_[id];
}

std::optional<int32_t> Tokenizer::TokenId(absl::string_view token) const {
  auto it = added_ids_.find(token);
  if (it != added_ids_.end()) return it->second;
  return model_->TokenId(token);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < token_flags_.size() &&
         (token_flags_[id] & kSpecial) != 0;
}

}  // namespace tandem::tokenizer
