#include "services/trainer/loss/chunked_logprobs.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/torch_status.h"
#if TANDEM_ENABLE_CUDA
#include "kernels/cuda/token_logprobs_cuda.h"
#endif

namespace tandem::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows [begin, end) of the LM head in float32 (a no-op view for float32).
at::Tensor VocabBlock(const at::Tensor& lm_head, int64_t begin, int64_t end) {
  return lm_head.slice(0, begin, end).to(at::kFloat);
}

// The custom autograd function. Saved for backward: hidden, lm_head,
// targets and the per-token log-sum-exp [T]; the logits are recomputed.
class ChunkedTokenLogProbs
    : public torch::autograd::Function<ChunkedTokenLogProbs> {
 public:
  // Returns {logprobs [T], entropy [T] (or an empty tensor)}.
  static variable_list forward(AutogradContext* ctx, at::Tensor hidden,
                               at::Tensor lm_head, at::Tensor targets,
                               int64_t chunk_tokens, int64_t chunk_vocab,
                               double temperature, bool compute_entropy) {
    const int64_t num_tokens = hidden.size(0);
    const int64_t vocab = lm_head.size(0);
    const auto float_opts = hidden.options().dtype(at::kFloat);
    at::Tensor logprobs = at::empty({num_tokens}, float_opts);
    at::Tensor lse = at::empty({num_tokens}, float_opts);
    at::Tensor entropy =
        compute_entropy ? at::empty({num_tokens}, float_opts) : at::Tensor();
    const double inv_temperature = 1.0 / temperature;

    for (int64_t t0 = 0; t0 < num_tokens; t0 += chunk_tokens) {
      const int64_t t1 = std::min(num_tokens, t0 + chunk_tokens);
      const at::Tensor h =
          hidden.slice(0, t0, t1).to(at::kFloat).mul(inv_temperature);
      const at::Tensor tgt = targets.slice(0, t0, t1);
      // Running max, rescaled sum of exp and (for entropy) rescaled sum of
      // exp * logit, all [t1 - t0].
      at::Tensor run_max = at::full(
          {t1 - t0}, -std::numeric_limits<float>::infinity(), float_opts);
      at::Tensor run_sum = at::zeros({t1 - t0}, float_opts);
      at::Tensor run_dot =
          compute_entropy ? at::zeros({t1 - t0}, float_opts) : at::Tensor();
      for (int64_t v0 = 0; v0 < vocab; v0 += chunk_vocab) {
        const int64_t v1 = std::min(vocab, v0 + chunk_vocab);
        const at::Tensor logits = at::mm(h, VocabBlock(lm_head, v0, v1).t());
        const at::Tensor new_max = at::maximum(run_max, logits.amax(1));
        const at::Tensor rescale = (run_max - new_max).exp_();
        at::Tensor e = logits.sub(new_max.unsqueeze(1)).exp_();
        run_sum.mul_(rescale).add_(e.sum(1));
        if (compute_entropy) {
          run_dot.mul_(rescale).add_(e.mul_(logits).sum(1));
        }
        run_max = new_max;
      }
      at::Tensor block_lse = run_max + run_sum.log();
      // Target logits directly: <h_t, lm_head[target_t]>.
      const at::Tensor target_rows =
          lm_head.index_select(0, tgt).to(at::kFloat);
      const at::Tensor target_logit = (h * target_rows).sum(1);
      logprobs.slice(0, t0, t1).copy_(target_logit - block_lse);
      lse.slice(0, t0, t1).copy_(block_lse);
      if (compute_entropy) {
        // H = lse - sum_j p_j z_j, with sum_j p_j z_j = run_dot / run_sum.
        entropy.slice(0, t0, t1).copy_(block_lse - run_dot / run_sum);
      }
    }

    ctx->save_for_backward({hidden, lm_head, targets, lse});
    ctx->saved_data["chunk_tokens"] = chunk_tokens;
    ctx->saved_data["chunk_vocab"] = chunk_vocab;
    ctx->saved_data["temperature"] = temperature;
    if (!compute_entropy) entropy = at::empty({0}, float_opts);
    ctx->mark_non_differentiable({entropy});
    return {logprobs, entropy};
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& lm_head = saved[1];
    const at::Tensor& targets = saved[2];
    const at::Tensor& lse = saved[3];
    const int64_t chunk_tokens = ctx->saved_data["chunk_tokens"].toInt();
    const int64_t chunk_vocab = ctx->saved_data["chunk_vocab"].toInt();
    const double inv_temperature =
        1.0 / ctx->saved_data["temperature"].toDouble();
    const int64_t num_tokens = hidden.size(0);
    const int64_t vocab = lm_head.size(0);

    at::Tensor grad_logprobs = grad_outputs[0];
    const bool need_hidden = ctx->needs_input_grad(0);
    const bool need_head = ctx->needs_input_grad(1);
    if (!grad_logprobs.defined() || (!need_hidden && !need_head)) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
              at::Tensor(), at::Tensor(), at::Tensor()};
    }
    grad_logprobs = grad_logprobs.to(at::kFloat);
    const auto float_opts = hidden.options().dtype(at::kFloat);
    at::Tensor grad_hidden =
        need_hidden ? at::zeros({num_tokens, hidden.size(1)}, float_opts)
                    : at::Tensor();
    at::Tensor grad_head = need_head
                               ? at::zeros({vocab, lm_head.size(1)}, float_opts)
                               : at::Tensor();

    for (int64_t t0 = 0; t0 < num_tokens; t0 += chunk_tokens) {
      const int64_t t1 = std::min(num_tokens, t0 + chunk_tokens);
      const at::Tensor h =
          hidden.slice(0, t0, t1).to(at::kFloat).mul(inv_temperature);
      const at::Tensor tgt = targets.slice(0, t0, t1);
      const at::Tensor g = grad_logprobs.slice(0, t0, t1);
      const at::Tensor block_lse = lse.slice(0, t0, t1).unsqueeze(1);
      const at::Tensor neg_g = g.neg().unsqueeze(1);
      at::Tensor grad_h_block =
          need_hidden ? grad_hidden.slice(0, t0, t1) : at::Tensor();
      for (int64_t v0 = 0; v0 < vocab; v0 += chunk_vocab) {
        const int64_t v1 = std::min(vocab, v0 + chunk_vocab);
        const at::Tensor w = VocabBlock(lm_head, v0, v1);
        // d logp_t / d z_tj = onehot_tj - p_tj, scaled by the incoming
        // gradient g_t: G = -g * p, then + g at the target column.
        at::Tensor grad_logits = at::mm(h, w.t());
        grad_logits.sub_(block_lse).exp_().mul_(neg_g);
        const at::Tensor in_block = (tgt >= v0).logical_and_(tgt < v1);
        const at::Tensor rows = in_block.nonzero().squeeze(1);
        if (rows.numel() > 0) {
          const at::Tensor cols = tgt.index_select(0, rows) - v0;
          grad_logits.index_put_({rows, cols}, g.index_select(0, rows),
                                 /*accumulate=*/true);
        }
        if (need_hidden) grad_h_block.addmm_(grad_logits, w);
        if (need_head) grad_head.slice(0, v0, v1).addmm_(grad_logits.t(), h);
      }
    }
    // z = (hidden / T) @ lm_head^T: d/dhidden carries 1/T; d/dlm_head already
    // used the scaled h.
    if (need_hidden) {
      grad_hidden.mul_(inv_temperature);
      grad_hidden = grad_hidden.to(hidden.scalar_type());
    }
    if (need_head) grad_head = grad_head.to(lm_head.scalar_type());
    return {grad_hidden,  grad_head,    at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

#if TANDEM_ENABLE_CUDA
// The fused CUDA kernels (kernels/cuda/token_logprobs_cuda.h) as an
// autograd function: float32 copies of hidden and lm_head are saved with
// the log-sum-exp; gradients come back in the inputs' dtypes.
class CudaTokenLogProbs : public torch::autograd::Function<CudaTokenLogProbs> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& lm_head,
                               const at::Tensor& targets, double temperature) {
    const at::Tensor h = hidden.detach().to(at::kFloat).contiguous();
    const at::Tensor w = lm_head.detach().to(at::kFloat).contiguous();
    const at::Tensor t = targets.to(at::kLong).contiguous();
    const int64_t n = h.size(0);
    at::Tensor logprobs = at::empty({n}, h.options());
    at::Tensor lse = at::empty({n}, h.options());
    const absl::Status status = kernels::cuda::TokenLogProbsForward(
        h.data_ptr<float>(), w.data_ptr<float>(), t.data_ptr<int64_t>(), n,
        h.size(1), w.size(0), static_cast<float>(temperature),
        logprobs.data_ptr<float>(), lse.data_ptr<float>());
    TORCH_CHECK(status.ok(), "CUDA token log-probs: ", status.ToString());
    ctx->save_for_backward({h, w, t, lse});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["head_dtype"] = static_cast<int64_t>(lm_head.scalar_type());
    return {logprobs};
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& t = saved[2];
    const at::Tensor& lse = saved[3];
    const at::Tensor g = grad_outputs[0].to(at::kFloat).contiguous();
    at::Tensor grad_hidden = at::empty_like(h);
    at::Tensor grad_head = at::empty_like(w);
    const absl::Status status = kernels::cuda::TokenLogProbsBackward(
        h.data_ptr<float>(), w.data_ptr<float>(), t.data_ptr<int64_t>(),
        lse.data_ptr<float>(), g.data_ptr<float>(), h.size(0), h.size(1),
        w.size(0), static_cast<float>(ctx->saved_data["temperature"].toDouble()),
        grad_hidden.data_ptr<float>(), grad_head.data_ptr<float>());
    TORCH_CHECK(status.ok(), "CUDA token log-probs backward: ",
                status.ToString());
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    return {grad_hidden.to(dtype("hidden_dtype")),
            grad_head.to(dtype("head_dtype")), at::Tensor(), at::Tensor()};
  }
};
#endif

absl::Status ValidateInputs(const at::Tensor& hidden, const at::Tensor& lm_head,
                            const at::Tensor& targets,
                            const TokenLogProbsOptions& options) {
  if (!hidden.defined() || hidden.dim() != 2 ||
      !at::isFloatingType(hidden.scalar_type())) {
    return absl::InvalidArgumentError(
        "token log-probs: hidden must be a floating [T, H] tensor");
  }
  if (!lm_head.defined() || lm_head.dim() != 2 ||
      !at::isFloatingType(lm_head.scalar_type()) ||
      lm_head.size(1) != hidden.size(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token log-probs: lm_head must be a floating [V, ",
                     hidden.size(1), "] tensor"));
  }
  if (!targets.defined() || targets.dim() != 1 ||
      targets.size(0) != hidden.size(0) ||
      !at::isIntegralType(targets.scalar_type(), /*includeBool=*/false)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token log-probs: targets must be an integral [",
                     hidden.size(0), "] tensor"));
  }
  if (options.chunk_tokens <= 0 || options.chunk_vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token log-probs: chunk_tokens and chunk_vocab must be > 0, got ",
        options.chunk_tokens, " and ", options.chunk_vocab));
  }
  if (!(options.temperature > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token log-probs: temperature must be > 0, got ", options.temperature));
  }
  if (targets.numel() > 0) {
    const int64_t lo = targets.min().item<int64_t>();
    const int64_t hi = targets.max().item<int64_t>();
    if (lo < 0 || hi >= lm_head.size(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token log-probs: targets must lie in [0, ",
                       lm_head.size(0), "), got range [", lo, ", ", hi, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenLogProbs> ComputeTokenLogProbs(
    const at::Tensor& hidden, const at::Tensor& lm_head,
    const at::Tensor& targets, const TokenLogProbsOptions& options) {
  absl::Status valid = ValidateInputs(hidden, lm_head, targets, options);
  if (!valid.ok()) return valid;
  const bool on_cuda = hidden.is_cuda() && lm_head.is_cuda();
  if (options.kernel == TokenLogProbsKernel::kCuda &&
      !(on_cuda && TANDEM_ENABLE_CUDA)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "token log-probs: the CUDA kernel needs CUDA tensors and a build "
        "with CUDA (tensors on ",
        hidden.device().str(), ", CUDA build: ",
        TANDEM_ENABLE_CUDA ? "yes" : "no", ")"));
  }
#if TANDEM_ENABLE_CUDA
  if (on_cuda && options.kernel != TokenLogProbsKernel::kAten) {
    try {
      TokenLogProbs result;
      result.logprobs = CudaTokenLogProbs::apply(
          hidden, lm_head, targets, options.temperature)[0];
      if (options.compute_entropy) {
        torch::NoGradGuard no_grad;
        result.entropy = ChunkedTokenLogProbs::apply(
            hidden.detach(), lm_head.detach(), targets.to(at::kLong),
            options.chunk_tokens, options.chunk_vocab, options.temperature,
            true)[1];
      }
      return result;
    } catch (const std::exception& e) {
      return model::internal::TorchErrorToStatus("CUDA token log-probs", e);
    }
  }
#endif
  try {
    variable_list out = ChunkedTokenLogProbs::apply(
        hidden, lm_head, targets.to(at::kLong), options.chunk_tokens,
        options.chunk_vocab, options.temperature, options.compute_entropy);
    TokenLogProbs result;
    result.logprobs = std::move(out[0]);
    if (options.compute_entropy) result.entropy = std::move(out[1]);
    return result;
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("chunked token log-probs", e);
  }
}

absl::StatusOr<TokenLogProbs> ComputeTokenLogProbsNaive(
    const at::Tensor& hidden, const at::Tensor& lm_head,
    const at::Tensor& targets, const TokenLogProbsOptions& options) {
  absl::Status valid = ValidateInputs(hidden, lm_head, targets, options);
  if (!valid.ok()) return valid;
  try {
    at::Tensor logits =
        at::mm(hidden.to(at::kFloat), lm_head.to(at::kFloat).t());
    if (options.temperature != 1.0) logits = logits.div(options.temperature);
    const at::Tensor log_probs = at::log_softmax(logits, 1);
    TokenLogProbs result;
    result.logprobs =
        log_probs.gather(1, targets.to(at::kLong).unsqueeze(1)).squeeze(1);
    if (options.compute_entropy) {
      torch::NoGradGuard no_grad;
      result.entropy = -(log_probs.exp() * log_probs).sum(1);
    }
    return result;
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("naive token log-probs", e);
  }
}

}  // namespace tandem::trainer
