// The decoder's entry points agree with each other: cached decode with the
// full forward, packed with per-sequence forward, bf16 with fp32.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/layers.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "tests/unit/model_test_util.h"

namespace tandem::model {
namespace {

using testing::TinyLlama3Config;
using testing::TinyQwen2Config;
using testing::TinyQwen3Config;

// Larger-than-default init so that attention patterns and norms matter.
const RandomInitOptions kTestInit{.stddev = 0.15, .norm_noise = 0.2};

std::shared_ptr<ModelWeights> MakeWeights(const ModelConfig& config,
                                          uint64_t seed = 7) {
  auto weights = RandomInit(config, seed, kTestInit);
  REQUIRE(weights.ok());
  return *weights;
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> out(n);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((state >> 33) % vocab);
  }
  return out;
}

at::Tensor ToTensor(const std::vector<int32_t>& tokens) {
  std::vector<int64_t> wide(tokens.begin(), tokens.end());
  return at::tensor(wide, at::kLong);
}

// Logits [n, V] of one sequence by the training forward.
at::Tensor FullLogits(const DecoderModel& model,
                      const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto logits = model.ForwardPacked(ToTensor(tokens), at::arange(n, at::kLong),
                                    at::tensor({int64_t{0}, n}, at::kLong));
  REQUIRE(logits.ok());
  return logits->to(at::kFloat);
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

std::unique_ptr<ContiguousKvCache> MakeCache(const DecoderModel& model,
                                             int64_t initial_capacity = 4) {
  const auto w = model.weights();
  auto cache = ContiguousKvCache::Create(w->config(), w->dtype(), w->device(),
                                         w->config().max_position_embeddings,
                                         initial_capacity);
  REQUIRE(cache.ok());
  return std::move(*cache);
}

// Prefills sequence b with prefix[b] tokens, then decodes the rest one token
// per step in one batch (sequences drop out as they end), comparing every
// step's logits with the full forward. Small initial capacities force the
// caches to grow mid-sequence.
double MaxCachedVsFullDiff(const ModelConfig& config, AttentionMode mode) {
  c10::NoGradGuard no_grad;
  DecoderModel model(MakeWeights(config), {.attention = mode});
  const std::vector<int64_t> lengths = {3, 9, 14, 6};
  const std::vector<int64_t> prefix = {1, 5, 2, 6};
  std::vector<std::vector<int32_t>> seqs;
  std::vector<at::Tensor> full;
  std::vector<std::unique_ptr<ContiguousKvCache>> caches;
  double worst = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    seqs.push_back(RandomTokens(lengths[b], config.vocab_size, 100 + b));
    full.push_back(FullLogits(model, seqs[b]));
    caches.push_back(MakeCache(model));
    const std::vector<int32_t> head(seqs[b].begin(),
                                    seqs[b].begin() + prefix[b]);
    auto logits = model.Prefill(head, caches[b].get());
    REQUIRE(logits.ok());
    REQUIRE(caches[b]->num_tokens() == prefix[b]);
    worst = std::max(worst, MaxAbsDiff(*logits, full[b][prefix[b] - 1]));
  }
  for (int64_t pos = 1; pos < 14; ++pos) {
    std::vector<int32_t> tokens;
    std::vector<KvCache*> active;
    std::vector<size_t> which;
    for (size_t b = 0; b < lengths.size(); ++b) {
      if (pos >= prefix[b] && pos < lengths[b]) {
        tokens.push_back(seqs[b][pos]);
        active.push_back(caches[b].get());
        which.push_back(b);
      }
    }
    if (tokens.empty()) continue;
    auto logits = model.DecodeStep(tokens, active);
    REQUIRE(logits.ok());
    REQUIRE(logits->sizes() ==
            at::IntArrayRef(
                {static_cast<int64_t>(tokens.size()), config.vocab_size}));
    for (size_t i = 0; i < which.size(); ++i) {
      worst = std::max(worst, MaxAbsDiff((*logits)[i], full[which[i]][pos]));
    }
  }
  for (size_t b = 0; b < lengths.size(); ++b) {
    REQUIRE(caches[b]->num_tokens() == lengths[b]);
  }
  return worst;
}

// Tolerance for fp32 paths that differ only in operation shapes (the
// blocking of matmuls): logits are O(1), observed differences ~1e-6.
constexpr double kFp32Tolerance = 1e-4;

TEST_CASE("Cached decode of a ragged batch equals the full forward (fp32)",
          "[model]") {
  for (AttentionMode mode :
       {AttentionMode::kPerSequence, AttentionMode::kPadded}) {
    INFO("attention mode " << static_cast<int>(mode));
    CHECK(MaxCachedVsFullDiff(TinyQwen2Config(), mode) < kFp32Tolerance);
    CHECK(MaxCachedVsFullDiff(TinyQwen3Config(), mode) < kFp32Tolerance);
    CHECK(MaxCachedVsFullDiff(TinyLlama3Config(), mode) < kFp32Tolerance);
  }
}

TEST_CASE("Cached decode equals the full forward in bf16 within 0.25",
          "[model]") {
  // Logits reach ~4 and are bf16 (lm_head output), whose spacing at 4 is
  // 0.03; the two paths round intermediate bf16 results differently
  // (observed 0.09, 3 ulps). 0.25 allows 8 ulps.
  ModelConfig config = TinyQwen2Config();
  config.dtype = WeightDType::kBFloat16;
  CHECK(MaxCachedVsFullDiff(config, AttentionMode::kPerSequence) < 0.25);
  CHECK(MaxCachedVsFullDiff(config, AttentionMode::kPadded) < 0.25);
}

TEST_CASE("Packed forward equals per-sequence forward", "[model]") {
  for (const auto& [config, mode] :
       {std::pair{TinyQwen2Config(), AttentionMode::kPerSequence},
        std::pair{TinyQwen2Config(), AttentionMode::kPadded},
        std::pair{TinyQwen3Config(), AttentionMode::kPerSequence},
        std::pair{TinyQwen3Config(), AttentionMode::kPadded},
        std::pair{TinyLlama3Config(), AttentionMode::kPadded}}) {
    INFO(ArchitectureName(config.architecture)
         << " attention mode " << static_cast<int>(mode));
    DecoderModel model(MakeWeights(config), {.attention = mode});
    const std::vector<int64_t> lengths = {5, 1, 11, 7};
    std::vector<int32_t> packed;
    std::vector<int64_t> positions, cu = {0};
    std::vector<at::Tensor> separate;
    for (size_t b = 0; b < lengths.size(); ++b) {
      auto seq = RandomTokens(lengths[b], config.vocab_size, 200 + b);
      separate.push_back(FullLogits(model, seq));
      packed.insert(packed.end(), seq.begin(), seq.end());
      for (int64_t i = 0; i < lengths[b]; ++i) positions.push_back(i);
      cu.push_back(cu.back() + lengths[b]);
    }
    auto logits =
        model.ForwardPacked(ToTensor(packed), at::tensor(positions, at::kLong),
                            at::tensor(cu, at::kLong));
    REQUIRE(logits.ok());
    CHECK(MaxAbsDiff(*logits, at::cat(separate, 0)) < kFp32Tolerance);
  }
}

TEST_CASE("Mixed prefill and decode in one cached step", "[model]") {
  c10::NoGradGuard no_grad;
  const AttentionMode mode =
      GENERATE(AttentionMode::kPerSequence, AttentionMode::kPadded);
  DecoderModel model(MakeWeights(TinyQwen3Config()), {.attention = mode});
  const auto a = RandomTokens(8, 97, 1);
  const auto b = RandomTokens(6, 97, 2);
  auto cache_a = MakeCache(model);
  auto cache_b = MakeCache(model);
  REQUIRE(model.Prefill({a.data(), 7}, cache_a.get()).ok());
  // a decodes its 8th token while b prefills all 6, with every logit.
  const SequenceStep steps[] = {{{a.data() + 7, 1}, cache_a.get()},
                                {b, cache_b.get()}};
  auto logits = model.ForwardWithCache(steps, /*all_logits=*/true);
  REQUIRE(logits.ok());
  REQUIRE(logits->size(0) == 7);
  CHECK(MaxAbsDiff((*logits)[0], FullLogits(model, a)[7]) < kFp32Tolerance);
  CHECK(MaxAbsDiff(logits->narrow(0, 1, 6), FullLogits(model, b)) <
        kFp32Tolerance);
}

TEST_CASE("bf16 and fp32 weights give logits within 5% of their range",
          "[model]") {
  // Same seed: the bf16 weights are the rounding of the fp32 ones. bf16
  // keeps 8 mantissa bits (relative error 2^-9 per rounding); through two
  // layers the logits stay within 5% of the largest |logit| (observed
  // ~3%), and on average within 1%.
  ModelConfig config = TinyQwen2Config();
  DecoderModel fp32(MakeWeights(config, 11));
  config.dtype = WeightDType::kBFloat16;
  DecoderModel bf16(MakeWeights(config, 11));
  REQUIRE(bf16.weights()->dtype() == at::kBFloat16);
  const auto tokens = RandomTokens(16, config.vocab_size, 5);
  const at::Tensor ref = FullLogits(fp32, tokens);
  const at::Tensor low = FullLogits(bf16, tokens);
  const double range = ref.abs().max().item<double>();
  INFO("max |logit| " << range << ", max diff " << MaxAbsDiff(ref, low));
  CHECK(MaxAbsDiff(ref, low) < 0.05 * range);
  CHECK((ref - low).abs().mean().item<double>() < 0.01 * range);
}

TEST_CASE("Training forward propagates gradients to the weights", "[model]") {
  auto weights = MakeWeights(TinyQwen2Config());
  for (const auto& [name, t] : weights->tensors()) {
    at::Tensor(t).requires_grad_(true);
  }
  DecoderModel model(weights);
  const auto tokens = RandomTokens(9, 97, 3);
  auto hidden = model.ForwardPackedHidden(
      ToTensor(tokens), at::tensor({0, 1, 2, 3, 0, 1, 2, 3, 4}, at::kLong),
      at::tensor({0, 4, 9}, at::kLong));
  REQUIRE(hidden.ok());
  REQUIRE(hidden->sizes() == at::IntArrayRef({9, 64}));
  auto logits = model.LmHead(*hidden);
  REQUIRE(logits.ok());
  at::log_softmax(*logits, -1).select(1, 0).sum().backward();
  for (const auto& [name, t] : weights->tensors()) {
    INFO(name);
    REQUIRE(t.grad().defined());
    CHECK(t.grad().abs().sum().item<double>() > 0);
    CHECK(at::isfinite(t.grad()).all().item<bool>());
  }
}

// LinearMode::kWeightLeft computes every projection and the LM head as
// (W x^T)^T and kRowKernel with kernels::RowGemmF32 (outside autograd; with
// gradients it falls back to kWeightLeft), not at::linear's x W^T (issue
// 20): the same logits and gradients up to summation order, with and
// without biases (Qwen2 has q/k/v biases, Llama none), in the training
// forward and in cached decode.
TEST_CASE("Weight-left and row-kernel projections equal at::linear",
          "[model]") {
  for (const ModelConfig& config : {TinyQwen2Config(), TinyLlama3Config()}) {
    INFO(std::string(ArchitectureName(config.architecture)));
    auto weights = MakeWeights(config);
    const DecoderModel linear(weights, {.linear = LinearMode::kLinear});
    const DecoderModel left(weights, {.linear = LinearMode::kWeightLeft});
    const DecoderModel kernel(weights, {.linear = LinearMode::kRowKernel});
    const DecoderModel* models[] = {&linear, &left, &kernel};
    const auto tokens = RandomTokens(11, config.vocab_size, 5);
    const at::Tensor ids = ToTensor(tokens);
    const at::Tensor positions =
        at::tensor({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5}, at::kLong);
    const at::Tensor cu = at::tensor({0, 5, 11}, at::kLong);
    std::vector<at::Tensor> grads[3];
    at::Tensor logits[3];
    for (int m = 0; m < 3; ++m) {
      const DecoderModel& model = *models[m];
      for (const auto& [name, t] : weights->tensors()) {
        at::Tensor(t).mutable_grad() = at::Tensor();
        at::Tensor(t).requires_grad_(true);
      }
      auto out = model.ForwardPacked(ids, positions, cu);
      REQUIRE(out.ok());
      at::log_softmax(*out, -1).select(1, 3).sum().backward();
      logits[m] = out->detach();
      for (const auto& [name, t] : weights->tensors()) {
        grads[m].push_back(t.grad().clone());
        at::Tensor(t).requires_grad_(false);
      }
    }
    for (int m = 1; m < 3; ++m) {
      CHECK(MaxAbsDiff(logits[0], logits[m]) < kFp32Tolerance);
      for (size_t i = 0; i < grads[0].size(); ++i) {
        CHECK(MaxAbsDiff(grads[0][i], grads[m][i]) < kFp32Tolerance);
      }
    }
    // Cached decode of two sequences: prefill of 5 and 6 tokens (one call),
    // then one token each.
    c10::NoGradGuard no_grad;
    at::Tensor decoded[3];
    for (int m = 0; m < 3; ++m) {
      const DecoderModel& model = *models[m];
      auto a = MakeCache(model);
      auto b = MakeCache(model);
      const std::vector<int32_t> head_a(tokens.begin(), tokens.begin() + 4);
      const std::vector<int32_t> head_b(tokens.begin() + 5,
                                        tokens.begin() + 10);
      const SequenceStep prefill[] = {{head_a, a.get()}, {head_b, b.get()}};
      REQUIRE(model.ForwardWithCache(prefill).ok());
      const std::vector<int32_t> next = {tokens[4], tokens[10]};
      KvCache* caches[] = {a.get(), b.get()};
      auto step = model.DecodeStep(next, caches);
      REQUIRE(step.ok());
      decoded[m] = *step;
    }
    for (int m = 1; m < 3; ++m) {
      CHECK(MaxAbsDiff(decoded[0], decoded[m]) < kFp32Tolerance);
      CHECK(MaxAbsDiff(decoded[m][0], logits[0][4].to(at::kFloat)) <
            kFp32Tolerance);
      CHECK(MaxAbsDiff(decoded[m][1], logits[0][10].to(at::kFloat)) <
            kFp32Tolerance);
    }
  }
}

TEST_CASE("Packed forward rejects inconsistent inputs", "[model]") {
  DecoderModel model(MakeWeights(TinyQwen2Config()));
  const at::Tensor ids = at::tensor({1, 2, 3}, at::kLong);
  const at::Tensor pos = at::tensor({0, 1, 2}, at::kLong);
  auto bad_cu = model.ForwardPacked(ids, pos, at::tensor({0, 2}, at::kLong));
  REQUIRE(!bad_cu.ok());
  CHECK_THAT(std::string(bad_cu.status().message()),
             Catch::Contains("end at T = 3"));
  auto bad_id = model.ForwardPacked(at::tensor({1, 97, 3}, at::kLong), pos,
                                    at::tensor({0, 3}, at::kLong));
  REQUIRE(!bad_id.ok());
  CHECK_THAT(std::string(bad_id.status().message()),
             Catch::Contains("[0, 97)"));
}

TEST_CASE("Cached step with an out-of-range token changes no cache",
          "[model]") {
  DecoderModel model(MakeWeights(TinyQwen2Config()));
  auto cache = MakeCache(model);
  const int32_t bad[] = {3, 500};
  CHECK(absl::IsInvalidArgument(model.Prefill(bad, cache.get()).status()));
  CHECK(cache->num_tokens() == 0);
}

TEST_CASE("A full KV cache refuses more tokens", "[model]") {
  DecoderModel model(MakeWeights(TinyQwen2Config()));
  const auto w = model.weights();
  auto cache = ContiguousKvCache::Create(w->config(), w->dtype(), w->device(),
                                         /*max_tokens=*/4);
  REQUIRE(cache.ok());
  const auto tokens = RandomTokens(5, 97, 9);
  const auto status = model.Prefill(tokens, cache->get()).status();
  CHECK(absl::IsResourceExhausted(status));
  CHECK((*cache)->num_tokens() == 0);
}

TEST_CASE("Forked cache continues like the original", "[model]") {
  c10::NoGradGuard no_grad;
  DecoderModel model(MakeWeights(TinyQwen2Config()));
  auto cache = MakeCache(model);
  const auto prompt = RandomTokens(5, 97, 4);
  REQUIRE(model.Prefill(prompt, cache.get()).ok());
  auto fork = cache->Fork();
  REQUIRE(fork.ok());
  const int32_t next[] = {17};
  auto a = model.Prefill(next, cache.get());
  auto b = model.Prefill(next, fork->get());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(at::equal(*a, *b));
}

TEST_CASE("SwapWeights switches the function and rejects other shapes",
          "[model]") {
  const ModelConfig config = TinyQwen2Config();
  DecoderModel model(MakeWeights(config, 1));
  const auto tokens = RandomTokens(6, 97, 8);
  const at::Tensor before = FullLogits(model, tokens);
  auto next = MakeWeights(config, 2);
  auto old = model.SwapWeights(next);
  REQUIRE(old.ok());
  const at::Tensor after = FullLogits(model, tokens);
  CHECK(at::equal(after, FullLogits(DecoderModel(next), tokens)));
  CHECK(!at::equal(before, after));

  ModelConfig wider = config;
  wider.intermediate_size = 128;
  auto rejected = model.SwapWeights(MakeWeights(wider));
  CHECK(absl::IsInvalidArgument(rejected.status()));
  CHECK(model.weights() == next);
}

TEST_CASE("Llama-3 rope scaling keeps high and divides low frequencies",
          "[model]") {
  ModelConfig config = TinyLlama3Config();
  config.head_dim = 64;
  const at::Tensor scaled = internal::RopeInverseFrequencies(config);
  config.rope_scaling.reset();
  const at::Tensor plain = internal::RopeInverseFrequencies(config);
  REQUIRE(scaled.size(0) == 32);
  const double old_context = 64;
  for (int64_t i = 0; i < 32; ++i) {
    const double f = plain[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    const double s = scaled[i].item<double>();
    INFO("i " << i << " wavelen " << wavelen);
    if (wavelen < old_context / 4.0) {
      CHECK(s == f);
    } else if (wavelen > old_context / 1.0) {
      CHECK(s == Approx(f / 8.0).epsilon(1e-6));
    } else {
      CHECK(s <= f);
      CHECK(s >= f / 8.0);
    }
  }
}

}  // namespace
}  // namespace tandem::model
