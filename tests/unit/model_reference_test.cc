// DecoderModel against an independent, deliberately naive transcription of
// the Llama / Qwen2 / Qwen3 forward pass (per head, per position, RoPE and
// Llama-3 frequency scaling in double-precision scalar code), so that a
// mistake shared by all of DecoderModel's entry points (RoPE layout, GQA
// head mapping, q/k norm placement, bias, tied head) still fails a test.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "tests/unit/model_test_util.h"

namespace tandem::model {
namespace {

at::Tensor Rms(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x / at::sqrt(x.pow(2).mean(-1, true) + eps) * weight;
}

// Inverse frequencies as Meta's Llama-3 reference code computes them.
std::vector<double> InverseFrequencies(const ModelConfig& c) {
  std::vector<double> out;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
    if (c.rope_scaling.has_value()) {
      const RopeScaling& s = *c.rope_scaling;
      const double old = s.original_max_position_embeddings;
      const double wavelen = 2 * M_PI / f;
      if (wavelen > old / s.low_freq_factor) {
        f = f / s.factor;
      } else if (wavelen >= old / s.high_freq_factor) {
        const double smooth = (old / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    out.push_back(f);
  }
  return out;
}

// x [T, D] of one head at positions 0..T-1, rotated pairwise (i, i + D/2).
at::Tensor Rope(const at::Tensor& x, const std::vector<double>& inv_freq) {
  const int64_t t = x.size(0);
  const int64_t half = x.size(1) / 2;
  at::Tensor out = at::empty_like(x);
  auto in = x.accessor<float, 2>();
  auto o = out.accessor<float, 2>();
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * inv_freq[i];
      const double x1 = in[p][i], x2 = in[p][i + half];
      o[p][i] = static_cast<float>(x1 * std::cos(angle) - x2 * std::sin(angle));
      o[p][i + half] =
          static_cast<float>(x2 * std::cos(angle) + x1 * std::sin(angle));
    }
  }
  return out;
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor& b) {
  at::Tensor y = x.matmul(w.t());
  return b.defined() ? y + b : y;
}

// fp32 logits [T, V] of one sequence starting at position 0.
at::Tensor ReferenceLogits(const ModelWeights& w,
                           const std::vector<int64_t>& tokens) {
  c10::NoGradGuard no_grad;
  const ModelConfig& c = w.config();
  const int64_t t = static_cast<int64_t>(tokens.size());
  const int64_t d = c.head_dim;
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  const std::vector<double> inv_freq = InverseFrequencies(c);
  at::Tensor x =
      w.embed_tokens().index_select(0, at::tensor(tokens, at::kLong));
  const at::Tensor future =
      at::ones({t, t}, at::kBool).triu(1);  // j > i is hidden
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const LayerWeights& l = w.layer(layer);
    const at::Tensor h = Rms(x, l.input_layernorm, c.rms_norm_eps);
    const at::Tensor q = Linear(h, l.q_proj, l.q_bias);
    const at::Tensor k = Linear(h, l.k_proj, l.k_bias);
    const at::Tensor v = Linear(h, l.v_proj, l.v_bias);
    std::vector<at::Tensor> keys, values, heads;
    for (int64_t j = 0; j < c.num_key_value_heads; ++j) {
      at::Tensor kj = k.narrow(1, j * d, d);
      if (c.qk_norm) kj = Rms(kj, l.k_norm, c.rms_norm_eps);
      keys.push_back(Rope(kj.contiguous(), inv_freq));
      values.push_back(v.narrow(1, j * d, d));
    }
    for (int64_t hh = 0; hh < c.num_attention_heads; ++hh) {
      at::Tensor qh = q.narrow(1, hh * d, d);
      if (c.qk_norm) qh = Rms(qh, l.q_norm, c.rms_norm_eps);
      qh = Rope(qh.contiguous(), inv_freq);
      const int64_t kv = hh / group;
      const at::Tensor scores = qh.matmul(keys[kv].t())
                                    .div(std::sqrt(static_cast<double>(d)))
                                    .masked_fill(future, -INFINITY);
      heads.push_back(at::softmax(scores, -1).matmul(values[kv]));
    }
    x = x + Linear(at::cat(heads, 1), l.o_proj, l.o_bias);
    const at::Tensor h2 = Rms(x, l.post_attention_layernorm, c.rms_norm_eps);
    x = x + at::silu(h2.matmul(l.gate_proj.t()))
                .mul(h2.matmul(l.up_proj.t()))
                .matmul(l.down_proj.t());
  }
  x = Rms(x, w.final_norm(), c.rms_norm_eps);
  const at::Tensor head = c.tie_word_embeddings
                              ? w.embed_tokens()
                              : w.tensors().at("lm_head.weight");
  return x.matmul(head.t());
}

double MaxDiffToReference(const ModelConfig& config, int64_t length) {
  auto weights = RandomInit(config, 21, {.stddev = 0.15, .norm_noise = 0.2});
  REQUIRE(weights.ok());
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < length; ++i) {
    tokens.push_back((i * 37 + 11) % config.vocab_size);
  }
  DecoderModel model(*weights);
  auto logits = model.ForwardPacked(
      at::tensor(tokens, at::kLong), at::arange(length, at::kLong),
      at::tensor({int64_t{0}, length}, at::kLong));
  REQUIRE(logits.ok());
  const at::Tensor reference = ReferenceLogits(**weights, tokens);
  return (*logits - reference).abs().max().item<double>();
}

// Float32 versus a double-precision RoPE table and a different operation
// order: observed differences are ~5e-6 on logits of magnitude ~4.
constexpr double kTolerance = 2e-4;

TEST_CASE("Qwen2 forward matches the naive reference", "[model]") {
  CHECK(MaxDiffToReference(testing::TinyQwen2Config(), 24) < kTolerance);
}

TEST_CASE(
    "Qwen3 forward (q/k norm, explicit head_dim) matches the naive "
    "reference",
    "[model]") {
  CHECK(MaxDiffToReference(testing::TinyQwen3Config(), 24) < kTolerance);
}

TEST_CASE(
    "Llama-3 forward (scaled RoPE past the original context) matches "
    "the naive reference",
    "[model]") {
  // 80 positions > original_max_position_embeddings (64) of the config.
  CHECK(MaxDiffToReference(testing::TinyLlama3Config(), 80) < kTolerance);
}

}  // namespace
}  // namespace tandem::model
