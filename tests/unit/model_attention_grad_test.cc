// Gradients of the padded batch attention (PaddedCausalAttention, several
// sequences padded into one batch) against the per-sequence attention
// (CausalAttention), which the forward-only checks in model_test.cc cannot
// see: once for the attention op alone (random q/k/v, GQA, unequal lengths
// including 1 and one much longer, the training shape n == L and the
// chunk-after-cache shape n < L, fp32 and bf16), and once for a whole tiny
// model (the loss gradient of every weight, as tandem-sft computes it over
// a packed batch, against the same sequences one by one).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/layers.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "tests/unit/model_test_util.h"

namespace tandem::model {
namespace {

constexpr int64_t kHeads = 4;
constexpr int64_t kKvHeads = 2;
constexpr int64_t kDim = 16;

struct AttentionGrads {
  at::Tensor out, dq, dk, dv;  // all float32
};

// Max |a - b| over the max |b| (relative to the tensor's range).
double RelativeMaxDiff(const at::Tensor& a, const at::Tensor& b) {
  const double range = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / std::max(range, 1e-12);
}

// Attention of B sequences, sequence b with n[b] queries over length[b]
// keys, either through PaddedCausalAttention or one CausalAttention per
// sequence; the loss is sum(out * weight) so that every output element gets
// its own upstream gradient. q [sum n, heads, dim] and k, v
// [sum length, kv_heads, dim] are leaves of `dtype` made from the float32
// `q32`, `k32`, `v32`; gradients come back as float32.
AttentionGrads RunAttention(bool padded, at::ScalarType dtype,
                            const std::vector<int64_t>& n,
                            const std::vector<int64_t>& length,
                            const at::Tensor& q32, const at::Tensor& k32,
                            const at::Tensor& v32, const at::Tensor& weight) {
  c10::AutoGradMode grad_mode(true);
  const at::Tensor q = q32.to(dtype).detach().requires_grad_(true);
  const at::Tensor k = k32.to(dtype).detach().requires_grad_(true);
  const at::Tensor v = v32.to(dtype).detach().requires_grad_(true);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  std::vector<at::Tensor> qs, ks, vs, outs;
  int64_t q_start = 0, k_start = 0;
  for (size_t b = 0; b < n.size(); ++b) {
    const at::Tensor q_b = q.narrow(0, q_start, n[b]);
    const at::Tensor k_b = k.narrow(0, k_start, length[b]);
    const at::Tensor v_b = v.narrow(0, k_start, length[b]);
    if (padded) {
      qs.push_back(q_b);
      ks.push_back(k_b);
      vs.push_back(v_b);
    } else {
      outs.push_back(internal::CausalAttention(q_b, k_b.transpose(0, 1),
                                               v_b.transpose(0, 1), scale));
    }
    q_start += n[b];
    k_start += length[b];
  }
  const at::Tensor out =
      padded ? internal::PaddedCausalAttention(qs, ks, vs, scale)
             : at::cat(outs, 0);
  (out.to(at::kFloat) * weight).sum().backward();
  return {out.detach().to(at::kFloat), q.grad().to(at::kFloat),
          k.grad().to(at::kFloat), v.grad().to(at::kFloat)};
}

// Compares padded and per-sequence attention; `tolerance` is relative to
// each tensor's range.
void CheckAttentionGrads(at::ScalarType dtype, const std::vector<int64_t>& n,
                         const std::vector<int64_t>& length, double tolerance) {
  int64_t total_n = 0, total_length = 0;
  for (size_t b = 0; b < n.size(); ++b) {
    total_n += n[b];
    total_length += length[b];
  }
  const at::Tensor q = at::randn({total_n, kHeads, kDim});
  const at::Tensor k = at::randn({total_length, kKvHeads, kDim});
  const at::Tensor v = at::randn({total_length, kKvHeads, kDim});
  const at::Tensor weight = at::randn({total_n, kHeads * kDim});
  const AttentionGrads ref =
      RunAttention(false, dtype, n, length, q, k, v, weight);
  const AttentionGrads got =
      RunAttention(true, dtype, n, length, q, k, v, weight);
  for (const at::Tensor* t : {&got.out, &got.dq, &got.dk, &got.dv}) {
    REQUIRE(at::isfinite(*t).all().item<bool>());
  }
  const double out_diff = RelativeMaxDiff(got.out, ref.out);
  const double dq_diff = RelativeMaxDiff(got.dq, ref.dq);
  const double dk_diff = RelativeMaxDiff(got.dk, ref.dk);
  const double dv_diff = RelativeMaxDiff(got.dv, ref.dv);
  INFO("relative max diff: out " << out_diff << ", dq " << dq_diff << ", dk "
                                 << dk_diff << ", dv " << dv_diff);
  CHECK(out_diff < tolerance);
  CHECK(dq_diff < tolerance);
  CHECK(dk_diff < tolerance);
  CHECK(dv_diff < tolerance);
}

// Lengths 1 (a single token), short ones and one much longer (57).
const std::vector<int64_t> kLengths = {5, 1, 57, 9, 2, 14};
// Queries after a cache: the last n of each length, n < length where the
// length allows, one sequence decoding (n = 1) and one whole (n = length).
const std::vector<int64_t> kChunk = {3, 1, 6, 1, 2, 14};

// fp32: the two paths differ only in summation order (observed up to
// 4.6e-7 of the range on the hand-written padded path, 3.5e-7 through
// SDPA). bf16: both round q/k/v, probabilities and outputs to 8 mantissa
// bits, in different places; observed up to 0.63% of the range, so 3%
// leaves a wide margin while a wrong mask moves the result by the order of
// the range itself (a mask one key ahead: 0.87-1.06).
constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16Tolerance = 0.03;

TEST_CASE("Padded attention gradients equal per-sequence (training shape)",
          "[model][attention_grad]") {
  at::manual_seed(11);
  SECTION("fp32") {
    CheckAttentionGrads(at::kFloat, kLengths, kLengths, kFp32Tolerance);
  }
  SECTION("bf16") {
    CheckAttentionGrads(at::kBFloat16, kLengths, kLengths, kBf16Tolerance);
  }
}

TEST_CASE("Padded attention gradients equal per-sequence (chunk after cache)",
          "[model][attention_grad]") {
  at::manual_seed(12);
  SECTION("fp32") {
    CheckAttentionGrads(at::kFloat, kChunk, kLengths, kFp32Tolerance);
  }
  SECTION("bf16") {
    CheckAttentionGrads(at::kBFloat16, kChunk, kLengths, kBf16Tolerance);
  }
}

// Equal query counts (no padded query rows, the "dense" return) but
// unequal lengths.
TEST_CASE("Padded attention gradients equal per-sequence (all decoding)",
          "[model][attention_grad]") {
  at::manual_seed(13);
  CheckAttentionGrads(at::kFloat, {1, 1, 1, 1, 1, 1}, kLengths, kFp32Tolerance);
}

// The packed batch's attention (PackedPaddedCausalAttention, what
// DecoderModel's padded training path runs) against PaddedCausalAttention
// over the sequences' narrow views (what it ran before): the same
// operations on the same values, so output and gradients are equal bit for
// bit; only autograd's graph differs.
void CheckPackedEqualsViews(at::ScalarType dtype,
                            const std::vector<int64_t>& lengths) {
  c10::AutoGradMode grad_mode(true);
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  const at::Tensor q32 = at::randn({total, kHeads, kDim});
  const at::Tensor k32 = at::randn({total, kKvHeads, kDim});
  const at::Tensor v32 = at::randn({total, kKvHeads, kDim});
  const at::Tensor weight = at::randn({total, kHeads * kDim});
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  AttentionGrads got[2];
  for (bool packed : {false, true}) {
    const at::Tensor q = q32.to(dtype).detach().requires_grad_(true);
    const at::Tensor k = k32.to(dtype).detach().requires_grad_(true);
    const at::Tensor v = v32.to(dtype).detach().requires_grad_(true);
    at::Tensor out;
    if (packed) {
      out = internal::PackedPaddedCausalAttention(q, k, v, lengths, scale);
    } else {
      std::vector<at::Tensor> qs, ks, vs;
      int64_t start = 0;
      for (int64_t n : lengths) {
        qs.push_back(q.narrow(0, start, n));
        ks.push_back(k.narrow(0, start, n));
        vs.push_back(v.narrow(0, start, n));
        start += n;
      }
      out = internal::PaddedCausalAttention(qs, ks, vs, scale);
    }
    (out.to(at::kFloat) * weight).sum().backward();
    got[packed] = {out.detach().to(at::kFloat), q.grad().to(at::kFloat),
                   k.grad().to(at::kFloat), v.grad().to(at::kFloat)};
  }
  REQUIRE(got[1].out.sizes() == got[0].out.sizes());
  // == (not a byte compare): a gradient of exactly zero is +0 after the
  // views' zero-padded sum and may be -0 from the gather.
  CHECK((got[1].out == got[0].out).all().item<bool>());
  CHECK((got[1].dq == got[0].dq).all().item<bool>());
  CHECK((got[1].dk == got[0].dk).all().item<bool>());
  CHECK((got[1].dv == got[0].dv).all().item<bool>());
  // Not vacuous: every gradient has non-zero entries.
  CHECK(got[1].dq.abs().sum().item<double>() > 0.0);
  CHECK(got[1].dk.abs().sum().item<double>() > 0.0);
  CHECK(got[1].dv.abs().sum().item<double>() > 0.0);
}

TEST_CASE(
    "Packed padded attention equals padded attention over views, bit "
    "for bit",
    "[model][attention_grad]") {
  at::manual_seed(14);
  SECTION("fp32, unequal lengths") {
    CheckPackedEqualsViews(at::kFloat, kLengths);
  }
  SECTION("bf16, unequal lengths") {
    CheckPackedEqualsViews(at::kBFloat16, kLengths);
  }
  SECTION("fp32, equal lengths (no padded query rows)") {
    CheckPackedEqualsViews(at::kFloat, {7, 7, 7});
  }
}

std::vector<int32_t> Tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> out(n);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((state >> 33) % vocab);
  }
  return out;
}

// Sum over the sequences of the next-token cross-entropy of every position
// but the last, from one ForwardPacked call over `seqs` (packed as
// tandem-sft packs its batch: positions restart at 0, cu_seqlens marks the
// boundaries).
at::Tensor PackedLoss(const DecoderModel& model,
                      const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<int64_t> ids, positions, cu = {0}, loss_rows, targets;
  for (const auto& seq : seqs) {
    const int64_t start = cu.back();
    for (size_t i = 0; i < seq.size(); ++i) {
      ids.push_back(seq[i]);
      positions.push_back(static_cast<int64_t>(i));
      if (i + 1 < seq.size()) {
        loss_rows.push_back(start + static_cast<int64_t>(i));
        targets.push_back(seq[i + 1]);
      }
    }
    cu.push_back(start + static_cast<int64_t>(seq.size()));
  }
  auto logits = model.ForwardPacked(at::tensor(ids, at::kLong),
                                    at::tensor(positions, at::kLong),
                                    at::tensor(cu, at::kLong));
  REQUIRE(logits.ok());
  return at::cross_entropy_loss(
      logits->index_select(0, at::tensor(loss_rows, at::kLong)).to(at::kFloat),
      at::tensor(targets, at::kLong), /*weight=*/{}, at::Reduction::Sum);
}

// Weight gradients of the summed loss, by name, as float32.
std::vector<std::pair<std::string, at::Tensor>> WeightGrads(
    const std::shared_ptr<ModelWeights>& weights, const at::Tensor& loss) {
  for (const auto& [name, t] : weights->tensors()) {
    at::Tensor(t).mutable_grad() = at::Tensor();
  }
  loss.backward();
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (const auto& [name, t] : weights->tensors()) {
    REQUIRE(t.grad().defined());
    grads.emplace_back(name, t.grad().to(at::kFloat).clone());
  }
  return grads;
}

void CheckModelGrads(WeightDType dtype, double tolerance) {
  c10::AutoGradMode grad_mode(true);
  ModelConfig config = testing::TinyQwen2Config();  // GQA 4:2
  config.dtype = dtype;
  auto weights = RandomInit(config, 5, {.stddev = 0.15, .norm_noise = 0.2});
  REQUIRE(weights.ok());
  for (const auto& [name, t] : (*weights)->tensors()) {
    at::Tensor(t).requires_grad_(true);
  }
  // The batch through the padded path, forced; each sequence alone takes
  // CausalAttention whatever the mode.
  DecoderModel padded(*weights, {.attention = AttentionMode::kPadded});
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i = 0; i < static_cast<int64_t>(kLengths.size()); ++i) {
    seqs.push_back(Tokens(kLengths[i] + 1, config.vocab_size, 300 + i));
  }
  const at::Tensor batch_loss = PackedLoss(padded, seqs);
  const auto batch_grads = WeightGrads(*weights, batch_loss);
  at::Tensor one_by_one_loss = at::zeros({}, at::kFloat);
  for (const auto& seq : seqs) {
    one_by_one_loss = one_by_one_loss + PackedLoss(padded, {seq});
  }
  const auto ref_grads = WeightGrads(*weights, one_by_one_loss);
  INFO("losses " << batch_loss.item<double>() << " "
                 << one_by_one_loss.item<double>());
  CHECK(std::abs(batch_loss.item<double>() - one_by_one_loss.item<double>()) <
        tolerance * one_by_one_loss.item<double>());
  REQUIRE(batch_grads.size() == ref_grads.size());
  for (size_t i = 0; i < ref_grads.size(); ++i) {
    const double diff =
        RelativeMaxDiff(batch_grads[i].second, ref_grads[i].second);
    INFO(ref_grads[i].first << ": relative max diff " << diff);
    CHECK(at::isfinite(batch_grads[i].second).all().item<bool>());
    CHECK(diff < tolerance);
  }
}

TEST_CASE("A padded batch's weight gradients equal one-by-one (fp32)",
          "[model][attention_grad]") {
  // Two layers of summation-order differences: observed up to 1.9e-6 of a
  // gradient's range (hand-written padded path), 5.3e-7 (SDPA).
  CheckModelGrads(WeightDType::kFloat32, 1e-4);
}

TEST_CASE("A padded batch's weight gradients equal one-by-one (bf16)",
          "[model][attention_grad]") {
  // bf16 weights and activations; the two batchings round differently
  // through every matmul: observed up to 3.1% of a gradient's range on the
  // hand-written padded path, 0.97% through SDPA.
  CheckModelGrads(WeightDType::kBFloat16, 0.1);
}

}  // namespace
}  // namespace tandem::model
