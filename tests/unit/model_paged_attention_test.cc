// The paged decode attention's CPU reference (common/model/
// paged_attention.h) against PagedBatch's gather + scaled_dot_product_
// attention path on the same pool contents, and the decoder's logits with
// either path.

#include <ATen/ATen.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/paged_attention.h"
#include "common/model/paged_kv_cache.h"
#include "tests/unit/model_test_util.h"

namespace tandem::model {
namespace {

using testing::TinyQwen2Config;

// A pool of one layer with `heads` query and `kv_heads` kv heads, its
// contents random, and caches of `lengths` whose blocks interleave (they
// grow one token at a time in turn), so each sequence's blocks are
// scattered over the pool. Every cache holds lengths[b] - 1 tokens: the
// decode step adds the last.
struct PoolFixture {
  ModelConfig config;
  std::shared_ptr<KvBlockPool> pool;
  std::vector<std::unique_ptr<PagedKvCache>> caches;
};

PoolFixture MakePool(int64_t heads, int64_t kv_heads, int64_t head_dim,
                     int64_t block_size, const std::vector<int64_t>& lengths,
                     PagedAttention attention, at::ScalarType dtype,
                     uint64_t seed) {
  PoolFixture f;
  f.config = TinyQwen2Config();
  f.config.num_hidden_layers = 1;
  f.config.num_attention_heads = heads;
  f.config.num_key_value_heads = kv_heads;
  f.config.head_dim = head_dim;
  int64_t blocks = 0;
  for (int64_t l : lengths) blocks += (l + block_size - 1) / block_size;
  auto pool = KvBlockPool::Create(f.config, dtype, at::kCPU, blocks + 3,
                                  block_size, attention);
  REQUIRE(pool.ok());
  f.pool = *pool;
  at::manual_seed(seed);
  f.pool->keys(0).copy_(at::randn(f.pool->keys(0).sizes()));
  f.pool->values(0).copy_(at::randn(f.pool->values(0).sizes()));
  for (size_t b = 0; b < lengths.size(); ++b) {
    auto cache = PagedKvCache::Create(f.config, f.pool, 1 << 20);
    REQUIRE(cache.ok());
    f.caches.push_back(std::move(*cache));
  }
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  for (int64_t t = 0; t < longest; ++t) {
    for (size_t b = 0; b < lengths.size(); ++b) {
      if (t >= lengths[b]) continue;
      REQUIRE(f.caches[b]->Reserve(1).ok());
      if (t + 1 < lengths[b]) f.caches[b]->Commit(1);
    }
  }
  return f;
}

// One decode step's attention outputs [B, heads * dim] through PagedBatch.
at::Tensor DecodeAttention(PoolFixture* f, const at::Tensor& q,
                           const at::Tensor& k, const at::Tensor& v) {
  std::vector<KvCache*> caches;
  for (auto& c : f->caches) caches.push_back(c.get());
  const std::vector<int64_t> n(caches.size(), 1);
  CHECK(PagedBatch::UsesKernel(caches, n) ==
        (f->pool->attention() == PagedAttention::kKernel));
  auto plan = PagedBatch::Plan(caches, n);
  REQUIRE(plan != nullptr);
  return plan->Attend(0, q, k, v, 1.0 / std::sqrt(q.size(2)));
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>() /
         want.to(at::kFloat).abs().max().item<double>();
}

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> lengths;
};

// Batch sizes 1 to 17; GQA 4:2, 8:1 and none; ragged lengths with some at
// block edges (k * block_size and k * block_size + 1) and one of a single
// token.
const std::vector<Case> kCases = {
    {4, 2, 16, 4, {9}},
    {4, 2, 16, 4, {1, 4, 5, 8, 13}},
    {8, 1, 32, 16, {16, 17, 33, 1, 48, 31, 2, 64}},
    {4,
     4,
     24,
     8,
     {3, 8, 9, 16, 17, 24, 25, 40, 41, 7, 1, 12, 30, 31, 32, 33, 100}},
};

TEST_CASE("Paged decode kernel's CPU reference matches gather + SDPA (fp32)",
          "[model][paged][attention]") {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    INFO("heads " << c.heads << " kv " << c.kv_heads << " dim " << c.head_dim
                  << " block " << c.block_size << " batch "
                  << c.lengths.size());
    PoolFixture gather =
        MakePool(c.heads, c.kv_heads, c.head_dim, c.block_size, c.lengths,
                 PagedAttention::kGather, at::kFloat, seed);
    PoolFixture kernel =
        MakePool(c.heads, c.kv_heads, c.head_dim, c.block_size, c.lengths,
                 PagedAttention::kKernel, at::kFloat, seed);
    ++seed;
    const int64_t batch = static_cast<int64_t>(c.lengths.size());
    const at::Tensor q = at::randn({batch, c.heads, c.head_dim});
    const at::Tensor k = at::randn({batch, c.kv_heads, c.head_dim});
    const at::Tensor v = at::randn({batch, c.kv_heads, c.head_dim});
    const at::Tensor want = DecodeAttention(&gather, q, k, v);
    const at::Tensor got = DecodeAttention(&kernel, q, k, v);
    REQUIRE(got.sizes() == want.sizes());
    CHECK(RelativeError(got, want) < 1e-5);
    // Both stored the step's keys and values in the same slots.
    CHECK(at::equal(gather.pool->keys(0), kernel.pool->keys(0)));
    CHECK(at::equal(gather.pool->values(0), kernel.pool->values(0)));
  }
}

TEST_CASE("Paged decode kernel's CPU reference in bf16 and fp16 follows fp32",
          "[model][paged][attention]") {
  const Case& c = kCases[2];
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    INFO(dtype);
    PoolFixture low = MakePool(c.heads, c.kv_heads, c.head_dim, c.block_size,
                               c.lengths, PagedAttention::kKernel, dtype, 5);
    PoolFixture full =
        MakePool(c.heads, c.kv_heads, c.head_dim, c.block_size, c.lengths,
                 PagedAttention::kGather, at::kFloat, 5);
    // The same values, rounded to `dtype` once.
    full.pool->keys(0).copy_(low.pool->keys(0));
    full.pool->values(0).copy_(low.pool->values(0));
    const int64_t batch = static_cast<int64_t>(c.lengths.size());
    const at::Tensor q = at::randn({batch, c.heads, c.head_dim}).to(dtype);
    const at::Tensor k = at::randn({batch, c.kv_heads, c.head_dim}).to(dtype);
    const at::Tensor v = at::randn({batch, c.kv_heads, c.head_dim}).to(dtype);
    const at::Tensor got = DecodeAttention(&low, q, k, v);
    CHECK(got.scalar_type() == dtype);
    const at::Tensor want = DecodeAttention(&full, q.to(at::kFloat),
                                            k.to(at::kFloat), v.to(at::kFloat));
    // float32 accumulation: only the output's rounding (2^-8 for bf16).
    CHECK(RelativeError(got, want) < 1e-2);
  }
}

TEST_CASE("Paged decode attention refuses bad shapes with a message",
          "[model][paged][attention]") {
  const at::Tensor pool = at::zeros({8, 2, 4});
  const at::Tensor tables = at::zeros({1, 2}, at::kLong);
  const at::Tensor lengths = at::ones({1}, at::kLong);
  const auto message = [&](const at::Tensor& q, const at::Tensor& t,
                           const at::Tensor& l) -> std::string {
    try {
      (void)PagedDecodeAttention(q, pool, pool, t, l, 4, 1.0);
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  CHECK(message(at::zeros({1, 3, 4}), tables, lengths)
            .find("heads a multiple of kv_heads") != std::string::npos);
  CHECK(message(at::zeros({1, 2, 4}), tables, at::full({1}, 9, at::kLong))
            .find("has length 9") != std::string::npos);
  CHECK(message(at::zeros({1, 2, 4}), at::full({1, 2}, 2, at::kLong), lengths)
            .find("outside a pool of 2 blocks") != std::string::npos);
  CHECK(message(at::zeros({1, 2, 4}), tables, lengths).empty());
  CHECK(ParsePagedAttention("kernel").value() == PagedAttention::kKernel);
  CHECK(ParsePagedAttention("fast").status().message().find("'fast'") !=
        std::string::npos);
}

TEST_CASE("Decoder gives the same logits with the paged decode kernel",
          "[model][paged][attention]") {
  const ModelConfig config = TinyQwen2Config();
  auto weights = RandomInit(config, 11, {.stddev = 0.15, .norm_noise = 0.2});
  REQUIRE(weights.ok());
  const DecoderModel model(*weights);
  const auto run = [&](PagedAttention attention) {
    auto pool =
        KvBlockPool::Create(config, at::kFloat, at::kCPU, 64, 4, attention);
    REQUIRE(pool.ok());
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<at::Tensor> logits;
    for (int i = 0; i < 5; ++i) {
      auto cache = PagedKvCache::Create(config, *pool, 256);
      REQUIRE(cache.ok());
      caches.push_back(std::move(*cache));
    }
    // Ragged prompts (a prefill step: gathered either way), then decodes.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SequenceStep> steps;
    for (int i = 0; i < 5; ++i) {
      prompts.emplace_back(3 + 4 * i);
      for (size_t j = 0; j < prompts[i].size(); ++j) {
        prompts[i][j] = static_cast<int32_t>((7 * i + 3 * j) % 97);
      }
    }
    for (int i = 0; i < 5; ++i) steps.push_back({prompts[i], caches[i].get()});
    REQUIRE(model.ForwardWithCache(steps).ok());
    for (int t = 0; t < 9; ++t) {
      std::vector<int32_t> tokens(5);
      for (int i = 0; i < 5; ++i) tokens[i] = (11 * t + i) % 97;
      std::vector<KvCache*> ptrs;
      for (auto& c : caches) ptrs.push_back(c.get());
      auto step = model.DecodeStep(tokens, ptrs);
      REQUIRE(step.ok());
      logits.push_back(*step);
    }
    return logits;
  };
  const auto gather = run(PagedAttention::kGather);
  const auto kernel = run(PagedAttention::kKernel);
  for (size_t t = 0; t < gather.size(); ++t) {
    INFO("step " << t);
    CHECK(RelativeError(kernel[t], gather[t]) < 1e-5);
  }
}

}  // namespace
}  // namespace tandem::model
