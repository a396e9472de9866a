// ComputeTokenLogProbs (chunked, custom backward) against the naive
// full-logits log_softmax, values and gradients, in float32.
//
// Tolerance: absolute 2e-5 on log-probs and entropy, and 2e-5 absolute plus
// 1e-4 relative on gradients. Both paths are float32; they differ only in
// summation order (blocked matmuls, online log-sum-exp), which at these
// sizes (H <= 64, V <= 1000) moves results by ~1e-6.

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "services/trainer/loss/chunked_logprobs.h"

namespace tandem::trainer {
namespace {

constexpr double kAbsTol = 2e-5;
constexpr double kRelTol = 1e-4;

struct Problem {
  at::Tensor hidden;
  at::Tensor lm_head;
  at::Tensor targets;
  at::Tensor upstream;  // random dL/dlogprobs
};

Problem MakeProblem(int64_t tokens, int64_t hidden, int64_t vocab,
                    uint64_t seed) {
  at::manual_seed(seed);
  Problem p;
  p.hidden = at::randn({tokens, hidden}) * 0.5;
  p.lm_head = at::randn({vocab, hidden}) * 0.5;
  p.targets = at::randint(vocab, {tokens}, at::kLong);
  p.upstream = at::randn({tokens});
  return p;
}

struct Evaluated {
  at::Tensor logprobs;
  at::Tensor entropy;
  at::Tensor grad_hidden;
  at::Tensor grad_head;
};

Evaluated Evaluate(const Problem& p, const TokenLogProbsOptions& options,
                   bool naive) {
  at::Tensor h = p.hidden.clone().requires_grad_(true);
  at::Tensor w = p.lm_head.clone().requires_grad_(true);
  absl::StatusOr<TokenLogProbs> out =
      naive ? ComputeTokenLogProbsNaive(h, w, p.targets, options)
            : ComputeTokenLogProbs(h, w, p.targets, options);
  REQUIRE(out.ok());
  (out->logprobs * p.upstream).sum().backward();
  return {out->logprobs.detach(), out->entropy, h.grad(), w.grad()};
}

void RequireClose(const at::Tensor& got, const at::Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  REQUIRE(got.scalar_type() == at::kFloat);
  const double max_err = (got - want).abs().max().item<double>();
  INFO("max abs error " << max_err);
  REQUIRE(at::allclose(got, want, kRelTol, kAbsTol));
}

void RequireMatchesNaive(int64_t tokens, int64_t hidden, int64_t vocab,
                         const TokenLogProbsOptions& options) {
  const Problem p = MakeProblem(tokens, hidden, vocab, 1234 + tokens + vocab);
  const Evaluated chunked = Evaluate(p, options, /*naive=*/false);
  const Evaluated naive = Evaluate(p, options, /*naive=*/true);
  RequireClose(chunked.logprobs, naive.logprobs);
  RequireClose(chunked.entropy, naive.entropy.detach());
  RequireClose(chunked.grad_hidden, naive.grad_hidden);
  RequireClose(chunked.grad_head, naive.grad_head);
}

TEST_CASE(
    "Chunked log-probs and gradients equal naive when chunks do not "
    "divide T or vocab",
    "[trainer_loss]") {
  TokenLogProbsOptions options;
  options.chunk_tokens = 16;  // T = 37: 16 + 16 + 5
  options.chunk_vocab = 128;  // V = 1000: 7 x 128 + 104
  RequireMatchesNaive(37, 48, 1000, options);
}

TEST_CASE(
    "Chunked log-probs equal naive with a single block and with "
    "one-row blocks",
    "[trainer_loss]") {
  TokenLogProbsOptions whole;
  whole.chunk_tokens = 4096;
  whole.chunk_vocab = 4096;
  RequireMatchesNaive(21, 32, 257, whole);
  TokenLogProbsOptions tiny;
  tiny.chunk_tokens = 1;
  tiny.chunk_vocab = 7;
  RequireMatchesNaive(9, 16, 50, tiny);
}

TEST_CASE("Chunked log-probs equal naive with sampling temperature",
          "[trainer_loss]") {
  TokenLogProbsOptions options;
  options.chunk_tokens = 8;
  options.chunk_vocab = 100;
  options.temperature = 0.7;
  RequireMatchesNaive(30, 64, 333, options);
}

TEST_CASE("Chunked log-probs are stable for large logits", "[trainer_loss]") {
  // Logits around +-200: a naive exp would overflow float32.
  Problem p = MakeProblem(10, 8, 300, 7);
  p.hidden = p.hidden * 40.0;
  TokenLogProbsOptions options;
  options.chunk_tokens = 4;
  options.chunk_vocab = 64;
  const Evaluated chunked = Evaluate(p, options, false);
  REQUIRE(at::isfinite(chunked.logprobs).all().item<bool>());
  REQUIRE(at::isfinite(chunked.grad_hidden).all().item<bool>());
  const Evaluated naive = Evaluate(p, options, true);
  REQUIRE(at::allclose(chunked.logprobs, naive.logprobs, 1e-5, 1e-3));
}

TEST_CASE(
    "Chunked log-probs return grads in the inputs' dtype and skip "
    "inputs without grad",
    "[trainer_loss]") {
  const Problem p = MakeProblem(12, 16, 90, 3);
  at::Tensor h = p.hidden.to(at::kBFloat16).requires_grad_(true);
  at::Tensor w = p.lm_head.to(at::kBFloat16);  // frozen head
  TokenLogProbsOptions options;
  options.chunk_tokens = 5;
  options.chunk_vocab = 32;
  absl::StatusOr<TokenLogProbs> out =
      ComputeTokenLogProbs(h, w, p.targets, options);
  REQUIRE(out.ok());
  REQUIRE(out->logprobs.scalar_type() == at::kFloat);
  out->logprobs.sum().backward();
  REQUIRE(h.grad().scalar_type() == at::kBFloat16);
  REQUIRE_FALSE(w.grad().defined());
}

TEST_CASE("Chunked log-probs reject bad shapes, targets and options",
          "[trainer_loss]") {
  const Problem p = MakeProblem(4, 8, 20, 5);
  TokenLogProbsOptions options;
  at::Tensor bad_targets = p.targets.clone();
  bad_targets[0] = 20;
  REQUIRE(ComputeTokenLogProbs(p.hidden, p.lm_head, bad_targets, options)
              .status()
              .code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(ComputeTokenLogProbs(p.hidden, p.lm_head.slice(1, 0, 4), p.targets,
                               options)
              .status()
              .code() == absl::StatusCode::kInvalidArgument);
  options.chunk_vocab = 0;
  REQUIRE(ComputeTokenLogProbs(p.hidden, p.lm_head, p.targets, options)
              .status()
              .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the CUDA log-prob kernel is refused for CPU tensors; auto and "
          "aten agree on the CPU",
          "[trainer][logprobs]") {
  torch::manual_seed(3);
  const at::Tensor hidden = torch::randn({9, 16});
  const at::Tensor lm_head = torch::randn({40, 16});
  const at::Tensor targets = torch::randint(0, 40, {9}, torch::kLong);
  TokenLogProbsOptions options;
  options.kernel = TokenLogProbsKernel::kCuda;
  const auto refused = ComputeTokenLogProbs(hidden, lm_head, targets, options);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("tensors on cpu") !=
        std::string::npos);
  options.kernel = TokenLogProbsKernel::kAuto;
  const auto automatic = ComputeTokenLogProbs(hidden, lm_head, targets, options);
  options.kernel = TokenLogProbsKernel::kAten;
  const auto aten = ComputeTokenLogProbs(hidden, lm_head, targets, options);
  REQUIRE(automatic.ok());
  REQUIRE(aten.ok());
  CHECK(torch::equal(automatic->logprobs, aten->logprobs));
}

}  // namespace
}  // namespace tandem::trainer
