#include "common/tokenizer/bpe.h"

#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer {
namespace {

std::string Quote(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

}  // namespace

BpeModel::BpeModel(absl::flat_hash_map<std::string, int32_t> vocab,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    absl::flat_hash_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges,
    BpeOptions options) {
  std::unique_ptr<BpeModel> model(
      new BpeModel(std::move(vocab), std::move(options)));
  if (model->options_.unk_token.has_value()) {
    auto it = model->vocab_.find(*model->options_.unk_token);
    if (it == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unk_token: ", Quote(*model->options_.unk_token),
                       " is not in the vocabulary"));
    }
    model->unk_id_ = it->second;
  }
  model->merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    const std::string merged = absl::StrCat(left, right);
    auto missing = [&](absl::string_view what, absl::string_view token) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges[", i, "]: ", what, " ", Quote(token),
                       " is not in the vocabulary"));
    };
    std::optional<int32_t> left_id = model->TokenId(left);
    if (!left_id.has_value()) return missing("token", left);
    std::optional<int32_t> right_id = model->TokenId(right);
    if (!right_id.has_value()) return missing("token", right);
    std::optional<int32_t> merged_id = model->TokenId(merged);
    if (!merged_id.has_value()) return missing("merged token", merged);
    // Like Hugging Face, a repeated pair takes the rank of its last entry.
    model->merges_[PairKey(*left_id, *right_id)] =
        Merge{static_cast<int32_t>(i), *merged_id};
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::EncodeWord(absl::string_view word,
                          std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids;
  MergeWord(word, &word_ids);
  ids->insert(ids->end(), word_ids.begin(), word_ids.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kMaxCacheEntries) {
      cache_.try_emplace(word, std::move(word_ids));
    }
  }
}

void BpeModel::MergeWord(absl::string_view word,
                         std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    char32_t cp;
    int len = DecodeUtf8(word.substr(pos), &cp);
    if (len == 0) len = 1;
    auto it = vocab_.find(word.substr(pos, len));
    pos += len;
    int32_t id;
    if (it != vocab_.end()) {
      id = it->second;
      last_was_unk = false;
    } else if (unk_id_.has_value()) {
      if (options_.fuse_unk && last_was_unk) continue;
      id = *unk_id_;
      last_was_unk = true;
    } else {
      continue;
    }
    int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, -1, true});
    if (index > 0) symbols[index - 1].next = index;
  }
  if (symbols.size() > 1) {
    struct Candidate {
      int32_t rank;
      int32_t pos;
      int32_t new_id;
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : pos > other.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>,
                        std::greater<Candidate>>
        queue;
    auto push_pair = [&](int32_t pos) {
      int32_t next = symbols[pos].next;
      if (next < 0) return;
      auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
      if (it != merges_.end()) {
        queue.push(Candidate{it->second.rank, pos, it->second.new_id});
      }
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
      push_pair(i);
    }
    while (!queue.empty()) {
      Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[top.pos];
      if (!left.alive || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      // The candidate is stale when either side has merged since it was
      // queued; the pair that is there now was queued on its own.
      auto it = merges_.find(PairKey(left.id, right.id));
      if (it == merges_.end() || it->second.rank != top.rank ||
          it->second.new_id != top.new_id) {
        continue;
      }
      left.id = top.new_id;
      right.alive = false;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = top.pos;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(top.pos);
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.alive) out->push_back(symbol.id);
  }
}

}  // namespace tandem::tokenizer
