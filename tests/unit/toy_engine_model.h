#pragma once

// A deterministic stand-in for the neural network behind the engine's
// EngineModel seam, for engine tests. Each cached token stores a "key"
// computed from (token, position, weights seed at the time it was computed),
// so a cache kept across a weight update really holds old-weights state, as
// a transformer's KV cache does. Logits are a hash of all keys of the
// sequence so far and the current weights seed. Forward() refuses chunks
// that do not continue the cache exactly, so scheduling bugs fail loudly.

#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine_model.h"

namespace tandem::engine {

class ToyModel : public EngineModel, public WeightUpdateSource {
 public:
  explicit ToyModel(int32_t vocab) : vocab_(vocab) {}

  int32_t vocab_size() const override { return vocab_; }

  static uint64_t Mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }
  static uint64_t Key(int32_t token, int32_t position, uint64_t seed) {
    return Mix(static_cast<uint64_t>(token) * 1000003 + position * 7919 +
               seed * 104729);
  }
  // Logits after a cache whose keys sum to `keys`.
  void Logits(uint64_t keys, uint64_t seed, float* out) const {
    for (int32_t v = 0; v < vocab_; ++v) {
      out[v] =
          static_cast<float>(Mix(keys ^ Mix(v + 17 * seed)) % 10007) / 1000.0f;
    }
  }
  // Reference: logits after `tokens` with every key under `seed`.
  std::vector<float> ReferenceLogits(const std::vector<int32_t>& tokens,
                                     uint64_t seed) const {
    uint64_t keys = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      keys += Key(tokens[i], static_cast<int32_t>(i), seed);
    }
    std::vector<float> out(vocab_);
    Logits(keys, seed, out.data());
    return out;
  }

  absl::StatusOr<std::vector<float>> Forward(
      const std::vector<ForwardChunk>& chunks) override {
    ++forward_calls_;
    std::vector<float> out;
    for (const ForwardChunk& c : chunks) {
      std::vector<uint64_t>& cache = caches_[c.seq->id];
      if (static_cast<int32_t>(cache.size()) != c.start) {
        return absl::InternalError(
            absl::StrCat("sequence ", c.seq->id, " cache holds ", cache.size(),
                         " tokens but chunk starts at ", c.start));
      }
      for (int32_t i = c.start; i < c.end; ++i) {
        cache.push_back(Key(c.seq->token_at(i), i, seed_));
      }
      computed_tokens_ += c.end - c.start;
      if (c.wants_logits) {
        uint64_t keys = 0;
        for (uint64_t k : cache) keys += k;
        out.resize(out.size() + vocab_);
        Logits(keys, seed_, out.data() + out.size() - vocab_);
      }
    }
    max_batch_ = std::max<int32_t>(max_batch_, chunks.size());
    return out;
  }
  bool ForkCache(uint64_t src, uint64_t dst, int32_t n) override {
    auto it = caches_.find(src);
    if (it == caches_.end() || static_cast<int32_t>(it->second.size()) < n) {
      return false;
    }
    caches_[dst].assign(it->second.begin(), it->second.begin() + n);
    ++forks_;
    return true;
  }
  void ReleaseCache(uint64_t id) override { caches_.erase(id); }

  // WeightUpdateSource: version v has seed v.
  uint64_t ReadyVersion(uint64_t live) override {
    return staged_ > live ? staged_ : 0;
  }
  absl::StatusOr<uint64_t> Commit(uint64_t version) override {
    seed_ = version;
    ++commits_;
    return version;
  }
  void Stage(uint64_t version) { staged_ = version; }

  uint64_t seed_ = 0;
  uint64_t staged_ = 0;
  int64_t computed_tokens_ = 0;
  int32_t forward_calls_ = 0;
  int32_t forks_ = 0;
  int32_t commits_ = 0;
  int32_t max_batch_ = 0;

 private:
  const int32_t vocab_;
  std::map<uint64_t, std::vector<uint64_t>> caches_;
};

}  // namespace tandem::engine
