#include "services/trainer/loss/grpo_loss.h"

#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/torch_status.h"

namespace tandem::trainer {
namespace {

absl::Status ValidateOptions(const GrpoLossOptions& options) {
  if (!(options.advantage_eps >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpo loss: advantage_eps must be >= 0, got ", options.advantage_eps));
  }
  if (!(options.clip_low >= 0.0 && options.clip_low < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpo loss: clip_low must be in [0, 1), got ", options.clip_low));
  }
  if (!(options.clip_high >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpo loss: clip_high must be >= 0, got ", options.clip_high));
  }
  if (!(options.kl_beta >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpo loss: kl_beta must be >= 0, got ", options.kl_beta));
  }
  if (std::isnan(options.is_cap)) {
    return absl::InvalidArgumentError("grpo loss: is_cap is NaN");
  }
  return absl::OkStatus();
}

bool IsTokenVector(const at::Tensor& t, int64_t num_tokens) {
  return t.defined() && t.dim() == 1 && t.size(0) == num_tokens;
}

absl::Status ValidateBatch(const PackedPolicyBatch& b,
                           const GrpoLossOptions& options) {
  if (!b.new_logprobs.defined() || b.new_logprobs.dim() != 1) {
    return absl::InvalidArgumentError(
        "grpo loss: new_logprobs must be a [T] tensor");
  }
  const int64_t num_tokens = b.new_logprobs.size(0);
  const auto token_error = [num_tokens](const char* name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpo loss: ", name, " must be a [", num_tokens, "] tensor"));
  };
  if (!IsTokenVector(b.behavior_logprobs, num_tokens)) {
    return token_error("behavior_logprobs");
  }
  if (!IsTokenVector(b.mask, num_tokens)) return token_error("mask");
  if (!IsTokenVector(b.sequence_ids, num_tokens) ||
      !at::isIntegralType(b.sequence_ids.scalar_type(), false)) {
    return token_error("sequence_ids (integral)");
  }
  if (b.reference_logprobs.defined() &&
      !IsTokenVector(b.reference_logprobs, num_tokens)) {
    return token_error("reference_logprobs");
  }
  if (b.entropy.defined() && !IsTokenVector(b.entropy, num_tokens)) {
    return token_error("entropy");
  }
  if (options.kl_beta > 0.0 && !b.reference_logprobs.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpo loss: kl_beta = ", options.kl_beta, " needs reference_logprobs"));
  }
  if (b.total_tokens < 0 || b.total_sequences < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpo loss: total_tokens and total_sequences must be >= 0, got ",
        b.total_tokens, " and ", b.total_sequences));
  }
  int64_t num_sequences = 0;
  if (b.advantages.defined()) {
    if (b.advantages.dim() != 1) {
      return absl::InvalidArgumentError(
          "grpo loss: advantages must be a [N] tensor");
    }
    num_sequences = b.advantages.size(0);
  } else {
    if (!b.rewards.defined() || b.rewards.dim() != 1) {
      return absl::InvalidArgumentError(
          "grpo loss: rewards must be a [N] tensor");
    }
    num_sequences = b.rewards.size(0);
    if (!b.group_ids.defined() || b.group_ids.dim() != 1 ||
        b.group_ids.size(0) != num_sequences ||
        !at::isIntegralType(b.group_ids.scalar_type(), false)) {
      return absl::InvalidArgumentError(
          absl::StrCat("grpo loss: group_ids must be an integral [",
                       num_sequences, "] tensor"));
    }
  }
  if (num_tokens > 0) {
    const int64_t lo = b.sequence_ids.min().item<int64_t>();
    const int64_t hi = b.sequence_ids.max().item<int64_t>();
    if (lo < 0 || hi >= num_sequences) {
      return absl::InvalidArgumentError(
          absl::StrCat("grpo loss: sequence_ids must lie in [0, ",
                       num_sequences, "), got range [", lo, ", ", hi, "]"));
    }
  }
  return absl::OkStatus();
}

// Mean over the masked entries of a detached [T] tensor; 0 when none.
double MaskedMean(const at::Tensor& values, const at::Tensor& mask,
                  double count) {
  if (count <= 0.0) return 0.0;
  return (values * mask).sum().item<double>() / count;
}

}  // namespace

absl::StatusOr<at::Tensor> GroupAdvantages(const at::Tensor& rewards,
                                           const at::Tensor& group_ids,
                                           const GrpoLossOptions& options) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  if (!rewards.defined() || rewards.dim() != 1 || !group_ids.defined() ||
      group_ids.dim() != 1 || group_ids.size(0) != rewards.size(0)) {
    return absl::InvalidArgumentError(
        "group advantages: rewards and group_ids must be [N] tensors");
  }
  try {
    // N is the number of samples in a step (thousands at most): exact double
    // arithmetic on the host is simpler than scatter reductions and lets an
    // all-equal group give exactly zero.
    const at::Tensor r =
        rewards.detach().to(at::kCPU, at::kDouble).contiguous();
    const at::Tensor g = group_ids.to(at::kCPU, at::kLong).contiguous();
    const int64_t n = r.size(0);
    const double* rp = r.data_ptr<double>();
    const int64_t* gp = g.data_ptr<int64_t>();
    struct Group {
      double sum = 0.0;
      int64_t count = 0;
      double min = INFINITY;
      double max = -INFINITY;
      double sq = 0.0;
    };
    std::unordered_map<int64_t, Group> groups;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(rp[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group advantages: reward ", i, " is not finite: ", rp[i]));
      }
      Group& grp = groups[gp[i]];
      grp.sum += rp[i];
      grp.count += 1;
      grp.min = std::min(grp.min, rp[i]);
      grp.max = std::max(grp.max, rp[i]);
    }
    for (int64_t i = 0; i < n; ++i) {
      Group& grp = groups[gp[i]];
      const double d = rp[i] - grp.sum / static_cast<double>(grp.count);
      grp.sq += d * d;
    }
    at::Tensor out = at::empty({n}, r.options().dtype(at::kFloat));
    float* op = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const Group& grp = groups[gp[i]];
      if (grp.min == grp.max) {
        op[i] = 0.0f;
        continue;
      }
      const double mean = grp.sum / static_cast<double>(grp.count);
      double a = rp[i] - mean;
      if (options.advantage == AdvantageNormalization::kGroupMeanStd) {
        const double std_dev =
            std::sqrt(grp.sq / static_cast<double>(grp.count));
        a /= std_dev + options.advantage_eps;
      }
      op[i] = static_cast<float>(a);
    }
    return out.to(rewards.device());
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("group advantages", e);
  }
}

absl::StatusOr<GrpoLossResult> ComputeGrpoLoss(const PackedPolicyBatch& batch,
                                               const GrpoLossOptions& options) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  valid = ValidateBatch(batch, options);
  if (!valid.ok()) return valid;
  absl::StatusOr<at::Tensor> advantages =
      batch.advantages.defined()
          ? absl::StatusOr<at::Tensor>(batch.advantages.detach().to(at::kFloat))
          : GroupAdvantages(batch.rewards, batch.group_ids, options);
  if (!advantages.ok()) return advantages.status();
  try {
    GrpoLossResult result;
    result.advantages = *advantages;
    const int64_t num_sequences = advantages->size(0);
    const at::Tensor mask_bool = batch.mask.to(at::kBool);
    const at::Tensor mask = mask_bool.to(at::kFloat);
    const at::Tensor seq = batch.sequence_ids.to(at::kLong);
    const at::Tensor adv = advantages->index_select(0, seq);
    const at::Tensor new_lp = batch.new_logprobs.to(at::kFloat);
    const at::Tensor zeros = at::zeros_like(new_lp);
    // Unmasked slots may hold anything (prompt, padding); select before exp
    // so that no inf or NaN reaches the loss or its gradient.
    const at::Tensor log_ratio = at::where(
        mask_bool, new_lp - batch.behavior_logprobs.to(at::kFloat).detach(),
        zeros);
    const at::Tensor ratio = log_ratio.exp();
    const at::Tensor ratio_const = ratio.detach();
    const at::Tensor is_weight = options.is_cap > 0.0
                                     ? ratio_const.clamp_max(options.is_cap)
                                     : ratio_const;

    at::Tensor objective;
    at::Tensor clipped;  // [T] float, 1 where PPO clipping zeroes the gradient
    if (options.objective == PolicyObjective::kPpoClip) {
      const double lo = 1.0 - options.clip_low;
      const double hi = 1.0 + options.clip_high;
      objective = at::minimum(ratio * adv, ratio.clamp(lo, hi) * adv);
      if (options.is_cap > 0.0) {
        objective = objective * (options.is_cap / ratio_const).clamp_max(1.0);
      }
      clipped = ((adv > 0).logical_and(ratio_const > hi))
                    .logical_or((adv < 0).logical_and(ratio_const < lo))
                    .to(at::kFloat);
    } else {
      objective = is_weight * adv * at::where(mask_bool, new_lp, zeros);
      clipped = zeros;
    }
    at::Tensor per_token = -objective;
    at::Tensor k3;
    if (batch.reference_logprobs.defined()) {
      const at::Tensor ref_minus_new = at::where(
          mask_bool, batch.reference_logprobs.to(at::kFloat).detach() - new_lp,
          zeros);
      k3 = ref_minus_new.exp() - ref_minus_new - 1.0;
      if (options.kl_beta > 0.0) per_token = per_token + options.kl_beta * k3;
    }
    per_token = per_token * mask;

    const at::Tensor token_count = mask.sum();
    switch (options.aggregation) {
      case LossAggregation::kTokenMean:
        result.loss =
            batch.total_tokens > 0
                ? per_token.sum() / static_cast<double>(batch.total_tokens)
                : per_token.sum() / token_count.clamp_min(1.0);
        break;
      case LossAggregation::kSequenceMean: {
        const at::Tensor seq_sum =
            at::zeros({num_sequences}, per_token.options())
                .index_add(0, seq, per_token);
        const at::Tensor seq_count =
            at::zeros({num_sequences}, mask.options()).index_add(0, seq, mask);
        const at::Tensor has_tokens = (seq_count > 0).to(at::kFloat);
        const at::Tensor seq_mean_sum =
            (seq_sum / seq_count.clamp_min(1.0)).sum();
        result.loss =
            batch.total_sequences > 0
                ? seq_mean_sum / static_cast<double>(batch.total_sequences)
                : seq_mean_sum / has_tokens.sum().clamp_min(1.0);
        break;
      }
      case LossAggregation::kSumOverSequences:
        result.loss =
            per_token.sum() /
            static_cast<double>(batch.total_sequences > 0
                                    ? batch.total_sequences
                                    : std::max<int64_t>(num_sequences, 1));
        break;
    }

    torch::NoGradGuard no_grad;
    GrpoLossStats& s = result.stats;
    const double count = token_count.item<double>();
    s.num_tokens = static_cast<int64_t>(count);
    s.num_sequences = num_sequences;
    s.loss = result.loss.item<double>();
    s.clip_fraction = MaskedMean(clipped, mask, count);
    s.ratio_mean = MaskedMean(ratio_const, mask, count);
    if (k3.defined()) s.kl_mean = MaskedMean(k3.detach(), mask, count);
    if (batch.entropy.defined()) {
      s.entropy_mean =
          MaskedMean(batch.entropy.to(at::kFloat).detach(), mask, count);
    }
    if (count > 0.0) {
      const at::Tensor w = is_weight * mask;
      const double sum_w = w.sum().item<double>();
      const double sum_w2 = (w * w).sum().item<double>();
      s.effective_sample_size =
          sum_w2 > 0.0 ? sum_w * sum_w / sum_w2 / count : 0.0;
    }
    if (num_sequences > 0) {
      const at::Tensor a = advantages->to(at::kDouble);
      s.advantage_mean = a.mean().item<double>();
      s.advantage_std = a.std(/*unbiased=*/false).item<double>();
    }
    return result;
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("grpo loss", e);
  }
}

}  // namespace tandem::trainer
