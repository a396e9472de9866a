// The paged KV cache (common/model/paged_kv_cache.h) against the contiguous
// one: the same steps give the same logits, the pool's blocks are counted,
// refused when exhausted and returned on release.

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/paged_kv_cache.h"
#include "tests/unit/model_test_util.h"

namespace tandem::model {
namespace {

using testing::TinyLlama3Config;
using testing::TinyQwen2Config;
using testing::TinyQwen3Config;

const RandomInitOptions kTestInit{.stddev = 0.15, .norm_noise = 0.2};

std::vector<int32_t> Tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> out(n);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((state >> 33) % 97);
  }
  return out;
}

// Makes a fresh cache of one layout for `model`.
using CacheFactory = std::function<std::unique_ptr<KvCache>()>;

// Forks `cache`'s first `length` tokens into a new cache of its layout.
std::unique_ptr<KvCache> ForkOf(KvCache* cache, int64_t length) {
  if (auto* paged = dynamic_cast<PagedKvCache*>(cache)) {
    auto fork = paged->Fork(length);
    REQUIRE(fork.ok());
    return std::move(*fork);
  }
  auto fork = dynamic_cast<ContiguousKvCache*>(cache)->Fork();
  REQUIRE(fork.ok());
  (*fork)->Truncate(length);
  return std::move(*fork);
}

// A script of cached steps exercising every cache operation: prefill
// chunks mixed with decodes in one step, a fork of a prefix, a truncation
// and re-prefill, and ragged decodes crossing block boundaries. Returns
// every step's logits (all rows).
std::vector<at::Tensor> RunScript(const DecoderModel& model,
                                  const CacheFactory& make) {
  std::vector<std::unique_ptr<KvCache>> caches;
  for (int i = 0; i < 3; ++i) caches.push_back(make());
  std::vector<at::Tensor> out;
  const auto step = [&](std::vector<std::pair<int, std::vector<int32_t>>> s) {
    std::vector<SequenceStep> steps;
    for (auto& [c, tokens] : s) steps.push_back({tokens, caches[c].get()});
    auto logits = model.ForwardWithCache(steps, /*all_logits=*/true);
    REQUIRE(logits.ok());
    out.push_back(*logits);
  };
  step({{0, Tokens(7, 1)}, {1, Tokens(5, 2)}});
  step({{0, Tokens(1, 3)}, {1, Tokens(3, 4)}, {2, Tokens(6, 5)}});
  for (uint64_t i = 0; i < 4; ++i) {
    step({{0, Tokens(1, 10 + i)},
          {1, Tokens(1, 20 + i)},
          {2, Tokens(1, 30 + i)}});
  }
  caches.push_back(ForkOf(caches[0].get(), 6));  // cache 3
  caches[1]->Truncate(4);
  step({{3, Tokens(1, 40)}, {1, Tokens(2, 41)}, {0, Tokens(1, 42)}});
  for (uint64_t i = 0; i < 6; ++i) {
    step({{0, Tokens(1, 50 + i)},
          {1, Tokens(1, 60 + i)},
          {2, Tokens(1, 70 + i)},
          {3, Tokens(1, 80 + i)}});
  }
  return out;
}

double MaxPagedVsContiguousDiff(const ModelConfig& config, AttentionMode mode) {
  auto weights = RandomInit(config, 7, kTestInit);
  REQUIRE(weights.ok());
  const auto w = *weights;
  const DecoderModel model(w, {.attention = mode});
  const int64_t max_tokens = config.max_position_embeddings;
  const auto contiguous = RunScript(model, [&]() -> std::unique_ptr<KvCache> {
    auto cache = ContiguousKvCache::Create(config, w->dtype(), w->device(),
                                           max_tokens, 4);
    REQUIRE(cache.ok());
    return std::move(*cache);
  });
  // Blocks of 4 so that the script's sequences (up to 21 tokens) span
  // several and their slots are scattered over the pool.
  auto pool = KvBlockPool::Create(config, w->dtype(), w->device(), 32, 4);
  REQUIRE(pool.ok());
  const auto paged = RunScript(model, [&]() -> std::unique_ptr<KvCache> {
    auto cache = PagedKvCache::Create(config, *pool, max_tokens);
    REQUIRE(cache.ok());
    return std::move(*cache);
  });
  REQUIRE(contiguous.size() == paged.size());
  double worst = 0;
  for (size_t i = 0; i < paged.size(); ++i) {
    REQUIRE(paged[i].sizes() == contiguous[i].sizes());
    worst =
        std::max(worst, (paged[i] - contiguous[i]).abs().max().item<double>());
  }
  // Every cache released its blocks when the script ended.
  CHECK((*pool)->num_free() == 32);
  return worst;
}

TEST_CASE("Paged KV cache gives the contiguous cache's logits (fp32)",
          "[model][paged]") {
  // Per sequence, both layouts feed the same keys and values to the same
  // attention call (a gathered copy instead of a view): bit-exact. Padded,
  // the contiguous path's matmul + float32 softmax and the paged batch's
  // one scaled_dot_product_attention sum in different orders: float32
  // rounding (~1e-7 relative) through two layers: observed at most
  // 3.1e-6 (Qwen3) on logits of magnitude ~4; 1e-4 leaves 30x.
  for (const ModelConfig& config :
       {TinyQwen2Config(), TinyQwen3Config(), TinyLlama3Config()}) {
    INFO("architecture " << ArchitectureName(config.architecture));
    CHECK(MaxPagedVsContiguousDiff(config, AttentionMode::kPerSequence) == 0);
    CHECK(MaxPagedVsContiguousDiff(config, AttentionMode::kPadded) < 1e-4);
  }
}

TEST_CASE("Paged KV cache gives the contiguous cache's logits (bf16)",
          "[model][paged]") {
  // bf16 logits of magnitude ~4 have a spacing of 0.03; the padded paths
  // round bf16 intermediates differently: observed 0.071 (2-3 ulps);
  // 0.25 allows 8 ulps, model_test's bound against the full forward.
  ModelConfig config = TinyQwen2Config();
  config.dtype = WeightDType::kBFloat16;
  CHECK(MaxPagedVsContiguousDiff(config, AttentionMode::kPerSequence) == 0);
  CHECK(MaxPagedVsContiguousDiff(config, AttentionMode::kPadded) < 0.25);
}

TEST_CASE("An exhausted pool refuses a step and leaves the caches unchanged",
          "[model][paged]") {
  const ModelConfig config = TinyQwen2Config();
  auto weights = RandomInit(config, 7, kTestInit);
  REQUIRE(weights.ok());
  const DecoderModel model(*weights);
  auto pool = KvBlockPool::Create(config, at::kFloat, at::kCPU, 2, 4);
  REQUIRE(pool.ok());
  auto a = PagedKvCache::Create(config, *pool, 256);
  auto b = PagedKvCache::Create(config, *pool, 256);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(model.Prefill(Tokens(8, 1), a->get()).ok());  // both blocks
  CHECK((*pool)->num_free() == 0);
  const auto refused = model.Prefill(Tokens(1, 2), b->get());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK((*b)->num_tokens() == 0);
  CHECK((*b)->blocks().empty());
  const auto decode = model.Prefill(Tokens(1, 3), a->get());
  CHECK(decode.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK((*a)->num_tokens() == 8);
  CHECK((*a)->blocks().size() == 2);
  CHECK((*a)->Fork(1).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK((*pool)->num_free() == 0);
  // Freeing a block lets the refused sequence in.
  (*a)->Truncate(4);
  CHECK((*pool)->num_free() == 1);
  CHECK(model.Prefill(Tokens(1, 2), b->get()).ok());
}

TEST_CASE("Paged caches return their blocks on truncate and release",
          "[model][paged]") {
  const ModelConfig config = TinyQwen2Config();
  auto weights = RandomInit(config, 7, kTestInit);
  REQUIRE(weights.ok());
  const DecoderModel model(*weights);
  auto pool = KvBlockPool::Create(config, at::kFloat, at::kCPU, 16, 4);
  REQUIRE(pool.ok());
  CHECK((*pool)->allocated_bytes() == 2 * config.num_hidden_layers * 16 * 4 *
                                          config.num_key_value_heads *
                                          config.head_dim * 4);
  {
    auto a = PagedKvCache::Create(config, *pool, 256);
    auto b = PagedKvCache::Create(config, *pool, 256);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(model.Prefill(Tokens(9, 1), a->get()).ok());  // 3 blocks
    REQUIRE(model.Prefill(Tokens(4, 2), b->get()).ok());  // 1 block
    CHECK((*pool)->num_free() == 12);
    // A fresh pool hands out blocks in order: a sequence alone is one slice.
    CHECK((*a)->consecutive());
    auto fork = (*a)->Fork(5);  // 2 blocks of its own
    REQUIRE(fork.ok());
    CHECK((*fork)->num_tokens() == 5);
    CHECK((*pool)->num_free() == 10);
    (*a)->Truncate(3);  // keeps 1 of 3
    CHECK((*pool)->num_free() == 12);
    CHECK((*a)->num_tokens() == 3);
    // A reservation with room left takes nothing.
    REQUIRE((*a)->Reserve(1).ok());
    CHECK((*pool)->num_free() == 12);
    // b grows into a's freed blocks: no longer one slice, and its logits
    // still equal a contiguous cache's (the gathered path).
    const std::vector<int32_t> more = Tokens(5, 3);
    const auto paged_logits = model.Prefill(more, b->get());
    REQUIRE(paged_logits.ok());
    CHECK_FALSE((*b)->consecutive());
    auto reference =
        ContiguousKvCache::Create(config, at::kFloat, at::kCPU, 256);
    REQUIRE(reference.ok());
    REQUIRE(model.Prefill(Tokens(4, 2), reference->get()).ok());
    const auto contiguous_logits = model.Prefill(more, reference->get());
    REQUIRE(contiguous_logits.ok());
    CHECK(at::equal(*paged_logits, *contiguous_logits));
  }
  CHECK((*pool)->num_free() == 16);
}

TEST_CASE("Paged KV pool and cache reject bad sizes", "[model][paged]") {
  const ModelConfig config = TinyQwen2Config();
  CHECK(
      KvBlockPool::Create(config, at::kFloat, at::kCPU, 0, 4).status().code() ==
      absl::StatusCode::kInvalidArgument);
  CHECK(KvBlockPool::Create(config, at::kFloat, at::kCPU, 4, -1)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  auto pool = KvBlockPool::Create(config, at::kFloat, at::kCPU, 4, 4);
  REQUIRE(pool.ok());
  CHECK(PagedKvCache::Create(config, *pool, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(PagedKvCache::Create(TinyQwen3Config(), *pool, 16).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto cache = PagedKvCache::Create(config, *pool, 6);
  REQUIRE(cache.ok());
  CHECK((*cache)->Reserve(7).code() == absl::StatusCode::kResourceExhausted);
  CHECK((*pool)->num_free() == 4);
}

}  // namespace
}  // namespace tandem::model
