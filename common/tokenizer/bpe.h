#pragma once

// The BPE model of a Hugging Face tokenizer: a vocabulary, a ranked list of
// merges, and the merge loop that turns one pre-tokenized word into ids.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tandem::tokenizer {

struct BpeOptions {
  // Token emitted for a character that is not in the vocabulary. When unset,
  // such characters produce no token (the behaviour of Hugging Face's BPE
  // without `unk_token`).
  std::optional<std::string> unk_token;
  // Consecutive unknown characters produce a single unk token.
  bool fuse_unk = false;
  // A word that is itself in the vocabulary is emitted as one token without
  // running merges (Llama-3's `ignore_merges`).
  bool ignore_merges = false;
};

// Thread-safe: EncodeWord may be called concurrently; the word cache is
// guarded by a mutex.
class BpeModel {
 public:
  // `merges` are in rank order (index 0 merges first). Errors name the
  // offending entry as `merges[i]` or `unk_token` so that the caller can
  // prefix the JSON path of the model section.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      absl::flat_hash_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions options);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `word` to `ids`. `word` is split into UTF-8
  // characters (a byte that is not part of a well-formed character counts as
  // one character) which are then merged by rank.
  void EncodeWord(absl::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenId(absl::string_view token) const;
  const absl::flat_hash_map<std::string, int32_t>& vocab() const {
    return vocab_;
  }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };

  BpeModel(absl::flat_hash_map<std::string, int32_t> vocab, BpeOptions options);

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  void MergeWord(absl::string_view word, std::vector<int32_t>* out) const;

  // Words up to this many bytes are cached; the cache stops growing at
  // kMaxCacheEntries (it is never evicted, which keeps lookups cheap).
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;

  const absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  const BpeOptions options_;
  std::optional<int32_t> unk_id_;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_
      ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace tandem::tokenizer
