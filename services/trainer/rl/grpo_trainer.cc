#include "services/trainer/rl/grpo_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"

namespace tandem::trainer {

struct GrpoTrainer::Optimizer {
  std::vector<std::string> names;  // parallel to `parameters`
  // The float32 master tensors AdamW updates.
  std::vector<at::Tensor> parameters;
  // Parallel to `parameters`: the tensors the loss is computed with (the
  // same tensors in float32; bfloat16 copies with mixed precision).
  std::vector<at::Tensor> compute;
  bool mixed = false;
  std::unique_ptr<torch::optim::AdamW> adamw;
};

GrpoTrainer::~GrpoTrainer() = default;

namespace {

absl::Status ValidateOptions(const GrpoTrainerOptions& o) {
  if (!std::isfinite(o.reference_reward)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference_reward must be finite, got ", o.reference_reward));
  }
  if (o.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps must be >= 0, got ", o.warmup_steps));
  }
  if (o.micro_batch_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batch_tokens must be >= 0, got ", o.micro_batch_tokens));
  }
  if (o.schedule != LrSchedule::kConstant) {
    if (o.total_steps <= o.warmup_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", o.schedule == LrSchedule::kCosine ? "cosine" : "linear",
          " schedule needs total_steps > warmup_steps, got ",
          o.total_steps, " <= ", o.warmup_steps));
    }
    if (!(o.min_lr_ratio >= 0.0 && o.min_lr_ratio <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("min_lr_ratio must be in [0, 1], got ", o.min_lr_ratio));
    }
  }
  return absl::OkStatus();
}

// logits / T = (hidden / T) @ lm_head^T: scales each selected hidden row by
// its token's inverse sampling temperature (no-op when all are 1).
at::Tensor AtSamplingTemperature(const at::Tensor& selected,
                                 const std::vector<float>& inv_temperatures) {
  if (std::all_of(inv_temperatures.begin(), inv_temperatures.end(),
                  [](float v) { return v == 1.0f; })) {
    return selected;
  }
  return selected * torch::tensor(inv_temperatures, torch::kFloat)
                        .to(selected.device(), selected.dtype())
                        .unsqueeze(1);
}

// Consecutive sequences [begin, end) of at most `max_tokens` packed tokens
// each (a longer sequence alone); the whole range when max_tokens is 0.
std::vector<std::pair<size_t, size_t>> SplitMicroBatches(
    const std::vector<SequenceRef>& sequences, int64_t max_tokens) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t n = sequences[i].packed_tokens;
    if (max_tokens > 0 && i > begin && tokens + n > max_tokens) {
      out.emplace_back(begin, i);
      begin = i;
      tokens = 0;
    }
    tokens += n;
  }
  if (begin < sequences.size()) out.emplace_back(begin, sequences.size());
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpoTrainer>> GrpoTrainer::Create(
    const model::ModelWeights& initial, uint64_t initial_version,
    GrpoTrainerOptions options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<GrpoTrainer> trainer(new GrpoTrainer());
  trainer->options_ = options;
  trainer->version_ = initial_version;
  std::shared_ptr<model::ModelWeights> master;
  {
    torch::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(
        master, initial.To(initial.device(), model::WeightDType::kFloat32));
  }
  std::shared_ptr<model::ModelWeights> compute = master;
  const bool mixed = options.compute_dtype != model::WeightDType::kFloat32;
  if (mixed) {
    torch::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(compute,
                     master->To(master->device(), options.compute_dtype));
  }
  trainer->optimizer_ = std::make_unique<Optimizer>();
  trainer->optimizer_->mixed = mixed;
  try {
    for (const auto& [name, tensor] : master->tensors()) {
      const at::Tensor& computed = compute->tensors().at(name);
      computed.requires_grad_(true);
      trainer->optimizer_->names.push_back(name);
      trainer->optimizer_->parameters.push_back(tensor);
      trainer->optimizer_->compute.push_back(computed);
    }
    trainer->optimizer_->adamw = std::make_unique<torch::optim::AdamW>(
        trainer->optimizer_->parameters,
        torch::optim::AdamWOptions(options.lr)
            .betas({options.beta1, options.beta2})
            .weight_decay(options.weight_decay));
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("creating the optimizer", e);
  }
  trainer->master_ = std::move(master);
  trainer->policy_ = std::make_shared<model::DecoderModel>(std::move(compute));
  return trainer;
}

void GrpoTrainer::ZeroGradients() {
  optimizer_->adamw->zero_grad();
  if (!optimizer_->mixed) return;
  for (at::Tensor& t : optimizer_->compute) {
    if (t.grad().defined()) t.mutable_grad().reset();
  }
}

void GrpoTrainer::GradientsToMaster() {
  if (!optimizer_->mixed) return;
  for (size_t i = 0; i < optimizer_->parameters.size(); ++i) {
    const at::Tensor& grad = optimizer_->compute[i].grad();
    if (!grad.defined()) continue;
    optimizer_->parameters[i].mutable_grad() = grad.detach().to(at::kFloat);
    optimizer_->compute[i].mutable_grad().reset();
  }
}

void GrpoTrainer::MasterToCompute() {
  if (!optimizer_->mixed) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < optimizer_->parameters.size(); ++i) {
    optimizer_->compute[i].copy_(optimizer_->parameters[i]);
  }
}

absl::StatusOr<GrpoStepStats> GrpoTrainer::Step(
    const std::vector<ScoredPromptGroup>& input_groups) {
  const absl::Time start = absl::Now();
  GrpoStepStats stats;
  GrpoBatchOptions batch_options;
  batch_options.drop_uniform_groups = options_.drop_uniform_groups;
  batch_options.reference_guidance = options_.reference_guidance;
  batch_options.reference_reward = options_.reference_reward;
  ASSIGN_OR_RETURN(const GrpoBatch selected,
                   SelectGrpoBatch(input_groups, batch_options,
                                   version_.load()));
  stats.guided_groups = selected.guided_groups;
  stats.uniform_groups = selected.uniform_groups;
  stats.dropped_uniform_groups = selected.dropped_uniform_groups;
  stats.staleness = selected.staleness;
  stats.trained_tokens = selected.trained_tokens;
  const std::vector<SequenceRef>& sequences = selected.sequences;
  const std::vector<int64_t>& group_ids = selected.group_ids;
  const std::vector<float>& rewards = selected.rewards;
  if (selected.nonfinite_reward) {
    // Its group's advantages, and so the loss, would be NaN.
    ZeroGradients();
    stats.nonfinite = "reward";
    stats.policy_version = version_.load();
    return stats;
  }
  if (options_.loss.kl_beta > 0.0 && reference_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("kl_beta = ", options_.loss.kl_beta,
                     " needs a reference policy (SetReferencePolicy)"));
  }
  stats.reward_mean = selected.reward_mean;
  stats.reward_std = selected.reward_std;

  const auto weights = policy_->weights();
  // Everything the loss reads lives on the policy's device; the batch is
  // assembled on the host and copied once per micro-batch.
  const at::Device device = weights->device();
  try {
    const at::Tensor reward_tensor = torch::tensor(rewards, torch::kFloat);
    const at::Tensor group_tensor = torch::tensor(group_ids, torch::kLong);
    ASSIGN_OR_RETURN(
        const at::Tensor advantages,
        GroupAdvantages(reward_tensor, group_tensor, options_.loss));
    const double lr = LearningRate(step_ + 1);
    for (auto& group : optimizer_->adamw->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    stats.lr = lr;
    // The sequences to forward (see skip_zero_advantage) and their
    // advantages.
    std::vector<SequenceRef> active;
    std::vector<int64_t> active_index;
    {
      const at::Tensor a = advantages.to(torch::kFloat).contiguous();
      const float* adv = a.data_ptr<float>();
      // A reference policy's log-probs (KL term or statistic) need every
      // token. A batch without any signal is forwarded whole: its gradient
      // is zero either way, and its statistics (entropy, ratio) stay
      // defined.
      const bool any_signal = std::any_of(adv, adv + sequences.size(),
                                          [](float v) { return v != 0.0f; });
      const bool skip = options_.skip_zero_advantage && any_signal &&
                        options_.loss.kl_beta <= 0.0 && reference_ == nullptr;
      for (size_t i = 0; i < sequences.size(); ++i) {
        if (skip && adv[i] == 0.0f) continue;
        active.push_back(sequences[i]);
        active_index.push_back(static_cast<int64_t>(i));
      }
    }
    stats.skipped_sequences =
        static_cast<int64_t>(sequences.size() - active.size());
    const at::Tensor active_advantages =
        advantages.index_select(0, torch::tensor(active_index, torch::kLong))
            .to(device);
    ZeroGradients();
    // The whole batch, detached, for the statistics; gradients accumulate
    // over the micro-batches.
    std::vector<at::Tensor> new_logprobs, entropies, reference_logprobs,
        behavior;
    std::vector<float> mask;
    std::vector<int64_t> sequence_ids;
    const auto micro_batches =
        SplitMicroBatches(active, options_.micro_batch_tokens);
    stats.micro_batches = static_cast<int64_t>(micro_batches.size());
    for (const auto& [begin, end] : micro_batches) {
      // Pack every (prompt + completion) as one sequence; select the
      // positions that predict completion tokens.
      std::vector<int64_t> input_ids, position_ids, cu_seqlens = {0};
      std::vector<int64_t> predict_rows, targets, local_ids;
      std::vector<float> micro_behavior, micro_mask, inv_temperatures;
      // Per token: its behavior log-prob is the policy's own (a reference
      // completion, see ScoredCompletion::from_reference).
      std::vector<uint8_t> micro_own;
      for (size_t i = begin; i < end; ++i) {
        const std::vector<int32_t>& prompt = *active[i].prompt;
        const ScoredCompletion& c = *active[i].completion;
        const int64_t base = static_cast<int64_t>(input_ids.size());
        const int64_t prompt_len = static_cast<int64_t>(prompt.size());
        int64_t pos = 0;
        for (int32_t t : prompt) {
          input_ids.push_back(t);
          position_ids.push_back(pos++);
        }
        for (size_t k = 0; k < c.tokens.size(); ++k) {
          input_ids.push_back(c.tokens[k]);
          position_ids.push_back(pos++);
          predict_rows.push_back(base + prompt_len - 1 +
                                 static_cast<int64_t>(k));
          targets.push_back(c.tokens[k]);
          inv_temperatures.push_back(
              static_cast<float>(active[i].inv_temperature));
          local_ids.push_back(static_cast<int64_t>(i - begin));
          sequence_ids.push_back(static_cast<int64_t>(i));
          micro_mask.push_back(c.trained.empty() || c.trained[k] ? 1.0f : 0.0f);
          micro_own.push_back(c.from_reference ? 1 : 0);
        }
        micro_behavior.insert(micro_behavior.end(), c.behavior_logprobs.begin(),
                              c.behavior_logprobs.end());
        cu_seqlens.push_back(static_cast<int64_t>(input_ids.size()));
      }
      const at::Tensor input_tensor = torch::tensor(input_ids, torch::kLong);
      const at::Tensor position_tensor =
          torch::tensor(position_ids, torch::kLong);
      const at::Tensor cu_seqlens_tensor =
          torch::tensor(cu_seqlens, torch::kLong);
      const at::Tensor predict_tensor =
          torch::tensor(predict_rows, torch::kLong).to(device);
      const at::Tensor target_tensor =
          torch::tensor(targets, torch::kLong).to(device);
      ASSIGN_OR_RETURN(at::Tensor hidden,
                       policy_->ForwardPackedHidden(
                           input_tensor, position_tensor, cu_seqlens_tensor));
      const at::Tensor selected = AtSamplingTemperature(
          hidden.index_select(0, predict_tensor), inv_temperatures);
      ASSIGN_OR_RETURN(TokenLogProbs logprobs,
                       ComputeTokenLogProbs(selected, weights->lm_head(),
                                            target_tensor, options_.logprobs));
      at::Tensor micro_reference;
      if (reference_ != nullptr) {
        // The frozen reference: same tokens, same chunked log-probs, no
        // graph.
        torch::NoGradGuard no_grad;
        const auto reference_weights = reference_->weights();
        ASSIGN_OR_RETURN(at::Tensor reference_hidden,
                         reference_->ForwardPackedHidden(
                             input_tensor, position_tensor, cu_seqlens_tensor));
        TokenLogProbsOptions reference_options = options_.logprobs;
        reference_options.compute_entropy = false;
        ASSIGN_OR_RETURN(
            TokenLogProbs reference,
            ComputeTokenLogProbs(
                AtSamplingTemperature(
                    reference_hidden.index_select(0, predict_tensor),
                    inv_temperatures),
                reference_weights->lm_head(), target_tensor,
                reference_options));
        micro_reference = reference.logprobs.detach();
        reference_logprobs.push_back(micro_reference);
      }
      PackedPolicyBatch micro;
      micro.new_logprobs = logprobs.logprobs;
      micro.behavior_logprobs =
          torch::tensor(micro_behavior, torch::kFloat).to(device);
      if (std::find(micro_own.begin(), micro_own.end(), 1) !=
          micro_own.end()) {
        micro.behavior_logprobs = torch::where(
            torch::tensor(at::ArrayRef<uint8_t>(micro_own), torch::kUInt8)
                .to(device)
                .to(torch::kBool),
            logprobs.logprobs.detach().to(torch::kFloat),
            micro.behavior_logprobs);
      }
      micro.reference_logprobs = micro_reference;
      micro.mask = torch::tensor(micro_mask, torch::kFloat).to(device);
      micro.sequence_ids = torch::tensor(local_ids, torch::kLong).to(device);
      micro.advantages = active_advantages.slice(0, static_cast<int64_t>(begin),
                                                 static_cast<int64_t>(end));
      // Denominators of the whole batch, skipped sequences included (every
      // sequence has tokens in the loss).
      micro.total_tokens = stats.trained_tokens;
      micro.total_sequences = static_cast<int64_t>(sequences.size());
      ASSIGN_OR_RETURN(GrpoLossResult loss,
                       ComputeGrpoLoss(micro, options_.loss));
      loss.loss.backward();
      new_logprobs.push_back(logprobs.logprobs.detach());
      if (logprobs.entropy.defined()) {
        entropies.push_back(logprobs.entropy.detach());
      }
      behavior.push_back(micro.behavior_logprobs);
      mask.insert(mask.end(), micro_mask.begin(), micro_mask.end());
    }
    {
      // Statistics of the forwarded sequences, with the whole batch's
      // denominators (the loss is the sum of the micro-batches' losses).
      torch::NoGradGuard no_grad;
      PackedPolicyBatch batch;
      batch.new_logprobs = torch::cat(new_logprobs);
      batch.behavior_logprobs = torch::cat(behavior);
      batch.mask = torch::tensor(mask, torch::kFloat).to(device);
      batch.sequence_ids = torch::tensor(sequence_ids, torch::kLong).to(device);
      batch.advantages = active_advantages;
      batch.total_tokens = stats.trained_tokens;
      batch.total_sequences = static_cast<int64_t>(sequences.size());
      if (entropies.size() == new_logprobs.size()) {
        batch.entropy = torch::cat(entropies);
      }
      if (!reference_logprobs.empty()) {
        batch.reference_logprobs = torch::cat(reference_logprobs);
      }
      ASSIGN_OR_RETURN(GrpoLossResult whole,
                       ComputeGrpoLoss(batch, options_.loss));
      stats.loss = whole.stats;
    }
    GradientsToMaster();
    stats.grad_norm = torch::nn::utils::clip_grad_norm_(optimizer_->parameters,
                                                        options_.max_grad_norm);
    if (!std::isfinite(stats.loss.loss)) {
      stats.nonfinite = "loss";
    } else if (!std::isfinite(stats.grad_norm)) {
      stats.nonfinite = "grad_norm";
    }
    if (stats.skipped()) {
      // One NaN would spread to every weight through AdamW's moments.
      ZeroGradients();
      stats.policy_version = version_.load();
      stats.step_seconds = absl::ToDoubleSeconds(absl::Now() - start);
      return stats;
    }
    optimizer_->adamw->step();
    MasterToCompute();
    ++step_;
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("GRPO step", e);
  }
  stats.policy_version = ++version_;
  stats.step_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

double GrpoTrainer::LearningRate(int64_t step) const {
  const GrpoTrainerOptions& o = options_;
  if (step < o.warmup_steps) {
    return o.lr * static_cast<double>(step) / o.warmup_steps;
  }
  if (o.schedule == LrSchedule::kConstant) return o.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) /
                        static_cast<double>(o.total_steps - o.warmup_steps));
  const double remaining =
      o.schedule == LrSchedule::kLinear
          ? 1.0 - progress
          : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * remaining);
}

namespace {

// The key torch::optim keeps a parameter's state under (LibTorch 2: the
// parameter's TensorImpl pointer itself).
void* StateKey(const at::Tensor& parameter) {
  return parameter.unsafeGetTensorImpl();
}

}  // namespace

absl::StatusOr<GrpoTrainerState> GrpoTrainer::CaptureState() const {
  GrpoTrainerState state;
  state.step = step_;
  state.policy_version = version_.load();
  try {
    torch::NoGradGuard no_grad;
    const auto& states = optimizer_->adamw->state();
    for (size_t i = 0; i < optimizer_->parameters.size(); ++i) {
      auto it = states.find(StateKey(optimizer_->parameters[i]));
      if (it == states.end()) continue;
      const auto& adam =
          static_cast<const torch::optim::AdamWParamState&>(*it->second);
      AdamWMoments& m = state.moments[optimizer_->names[i]];
      m.step = adam.step();
      m.exp_avg = adam.exp_avg().detach().clone();
      m.exp_avg_sq = adam.exp_avg_sq().detach().clone();
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("capturing optimizer state", e);
  }
  return state;
}

absl::Status GrpoTrainer::RestoreState(const GrpoTrainerState& state) {
  if (!state.moments.empty() &&
      state.moments.size() != optimizer_->names.size()) {
    for (const auto& [name, m] : state.moments) {
      if (std::find(optimizer_->names.begin(), optimizer_->names.end(), name) ==
          optimizer_->names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state for '", name, "', which the model does not have"));
      }
    }
  }
  std::vector<std::unique_ptr<torch::optim::AdamWParamState>> restored;
  try {
    torch::NoGradGuard no_grad;
    for (size_t i = 0;
         i < optimizer_->parameters.size() && !state.moments.empty(); ++i) {
      const std::string& name = optimizer_->names[i];
      const at::Tensor& p = optimizer_->parameters[i];
      auto it = state.moments.find(name);
      if (it == state.moments.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state for '", name, "' is missing"));
      }
      const AdamWMoments& m = it->second;
      for (const at::Tensor* t : {&m.exp_avg, &m.exp_avg_sq}) {
        if (!t->defined() || t->sizes() != p.sizes()) {
          return absl::InvalidArgumentError(
              absl::StrCat("optimizer state for '", name, "': expected shape ",
                           c10::str(p.sizes()), ", got ",
                           t->defined() ? c10::str(t->sizes()) : "none"));
        }
      }
      auto adam = std::make_unique<torch::optim::AdamWParamState>();
      adam->step(m.step);
      adam->exp_avg(m.exp_avg.to(p.options()).clone());
      adam->exp_avg_sq(m.exp_avg_sq.to(p.options()).clone());
      restored.push_back(std::move(adam));
    }
    auto& states = optimizer_->adamw->state();
    states.clear();
    for (size_t i = 0; i < restored.size(); ++i) {
      states[StateKey(optimizer_->parameters[i])] = std::move(restored[i]);
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("restoring optimizer state", e);
  }
  step_ = state.step;
  version_ = state.policy_version;
  return absl::OkStatus();
}

std::map<std::string, at::Tensor> GrpoTrainer::GradientsForTest() const {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < optimizer_->parameters.size(); ++i) {
    const at::Tensor& grad = optimizer_->parameters[i].grad();
    out[optimizer_->names[i]] = grad.defined() ? grad.detach().clone() : grad;
  }
  return out;
}

absl::Status GrpoTrainer::SetReferencePolicy(
    const model::ModelWeights& reference) {
  const model::ModelConfig& policy = policy_->weights()->config();
  if (reference.config().vocab_size != policy.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the reference policy's vocab_size is ", reference.config().vocab_size,
        ", the policy's ", policy.vocab_size));
  }
  std::shared_ptr<model::ModelWeights> frozen;
  {
    torch::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(frozen, reference.To(policy_->weights()->device(),
                                          options_.compute_dtype));
  }
  reference_ = std::make_shared<model::DecoderModel>(std::move(frozen));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<model::ModelWeights>>
GrpoTrainer::SnapshotWeights() const {
  torch::NoGradGuard no_grad;
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> copy,
                   master_->To(master_->device(), master_->config().dtype));
  RETURN_IF_ERROR(CheckFiniteWeights(*copy));
  return copy;
}

absl::StatusOr<std::shared_ptr<const model::ModelWeights>>
GrpoTrainer::CheckedMasterWeights() const {
  RETURN_IF_ERROR(CheckFiniteWeights(*master_));
  return std::shared_ptr<const model::ModelWeights>(master_);
}

absl::Status CheckFiniteWeights(const model::ModelWeights& weights) {
  try {
    torch::NoGradGuard no_grad;
    // NaN propagates through min and max, and an infinity is one of them:
    // both finite means every element is. No full-size temporary.
    std::vector<at::Tensor> extremes;
    std::vector<const std::string*> names;
    for (const auto& [name, tensor] : weights.tensors()) {
      if (tensor.numel() == 0 || !tensor.is_floating_point()) continue;
      auto [min, max] = at::aminmax(tensor);
      extremes.push_back(min.to(torch::kFloat));
      extremes.push_back(max.to(torch::kFloat));
      names.push_back(&name);
    }
    if (extremes.empty()) return absl::OkStatus();
    const at::Tensor finite =
        torch::isfinite(torch::stack(extremes)).to(torch::kCPU);
    const bool* ok = finite.data_ptr<bool>();
    for (size_t i = 0; i < names.size(); ++i) {
      if (!ok[2 * i] || !ok[2 * i + 1]) {
        const at::Tensor& t = weights.tensors().at(*names[i]);
        return absl::DataLossError(
            absl::StrCat("weight '", *names[i], "' has ",
                         torch::isnan(t).sum().item<int64_t>(), " NaN and ",
                         torch::isinf(t).sum().item<int64_t>(),
                         " infinite values; refusing to publish or save it"));
      }
    }
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("checking weights are finite",
                                               e);
  }
  return absl::OkStatus();
}

}  // namespace tandem::trainer
