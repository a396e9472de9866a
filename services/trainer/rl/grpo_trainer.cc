#include "services/trainer/rl/grpo_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"

namespace tandem::trainer {

struct GrpoTrainer::Optimizer {
  std::vector<std::string> names;  // parallel to `parameters`
  std::vector<at::Tensor> parameters;
  std::unique_ptr<torch::optim::AdamW> adamw;
};

GrpoTrainer::~GrpoTrainer() = default;

absl::StatusOr<std::unique_ptr<GrpoTrainer>> GrpoTrainer::Create(
    const model::ModelWeights& initial, uint64_t initial_version,
    GrpoTrainerOptions options) {
  std::unique_ptr<GrpoTrainer> trainer(new GrpoTrainer());
  trainer->options_ = options;
  trainer->version_ = initial_version;
  std::shared_ptr<model::ModelWeights> master;
  {
    torch::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(
        master, initial.To(initial.device(), model::WeightDType::kFloat32));
  }
  trainer->optimizer_ = std::make_unique<Optimizer>();
  try {
    for (const auto& [name, tensor] : master->tensors()) {
      tensor.requires_grad_(true);
      trainer->optimizer_->names.push_back(name);
      trainer->optimizer_->parameters.push_back(tensor);
    }
    trainer->optimizer_->adamw = std::make_unique<torch::optim::AdamW>(
        trainer->optimizer_->parameters,
        torch::optim::AdamWOptions(options.lr)
            .betas({options.beta1, options.beta2})
            .weight_decay(options.weight_decay));
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("creating the optimizer", e);
  }
  trainer->policy_ = std::make_shared<model::DecoderModel>(std::move(master));
  return trainer;
}

absl::StatusOr<GrpoStepStats> GrpoTrainer::Step(
    const std::vector<ScoredPromptGroup>& groups) {
  const absl::Time start = absl::Now();
  GrpoStepStats stats;
  // Pack every (prompt + completion) as one sequence; select the positions
  // that predict completion tokens.
  std::vector<int64_t> input_ids, position_ids, cu_seqlens = {0};
  std::vector<int64_t> predict_rows, targets, sequence_ids, group_ids;
  std::vector<float> behavior, rewards;
  int64_t sequence = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const ScoredPromptGroup& group = groups[g];
    for (const ScoredCompletion& c : group.completions) {
      if (c.tokens.empty()) continue;
      if (c.behavior_logprobs.size() != c.tokens.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group ", g, ": completion has ", c.tokens.size(), " tokens but ",
            c.behavior_logprobs.size(), " behavior log-probs"));
      }
      const int64_t base = static_cast<int64_t>(input_ids.size());
      const int64_t prompt_len = static_cast<int64_t>(group.prompt.size());
      int64_t pos = 0;
      for (int32_t t : group.prompt) {
        input_ids.push_back(t);
        position_ids.push_back(pos++);
      }
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        input_ids.push_back(c.tokens[i]);
        position_ids.push_back(pos++);
        predict_rows.push_back(base + prompt_len - 1 + static_cast<int64_t>(i));
        targets.push_back(c.tokens[i]);
        sequence_ids.push_back(sequence);
        behavior.push_back(c.behavior_logprobs[i]);
      }
      cu_seqlens.push_back(static_cast<int64_t>(input_ids.size()));
      rewards.push_back(static_cast<float>(c.reward));
      group_ids.push_back(static_cast<int64_t>(g));
      stats.staleness.push_back(static_cast<int64_t>(version_.load()) -
                                static_cast<int64_t>(c.min_policy_version));
      ++sequence;
    }
  }
  if (sequence == 0) {
    return absl::InvalidArgumentError("batch has no completion tokens");
  }
  double sum = 0, sum_sq = 0;
  for (float r : rewards) {
    sum += r;
    sum_sq += static_cast<double>(r) * r;
  }
  stats.reward_mean = sum / rewards.size();
  stats.reward_std = std::sqrt(std::max(
      0.0, sum_sq / rewards.size() - stats.reward_mean * stats.reward_mean));
  stats.trained_tokens = static_cast<int64_t>(targets.size());

  const auto weights = policy_->weights();
  ASSIGN_OR_RETURN(
      at::Tensor hidden,
      policy_->ForwardPackedHidden(torch::tensor(input_ids, torch::kLong),
                                   torch::tensor(position_ids, torch::kLong),
                                   torch::tensor(cu_seqlens, torch::kLong)));
  try {
    const at::Tensor selected =
        hidden.index_select(0, torch::tensor(predict_rows, torch::kLong));
    auto logprobs = ComputeTokenLogProbs(selected, weights->lm_head(),
                                         torch::tensor(targets, torch::kLong),
                                         options_.logprobs);
    if (!logprobs.ok()) return logprobs.status();
    PackedPolicyBatch batch;
    batch.new_logprobs = logprobs->logprobs;
    batch.behavior_logprobs = torch::tensor(behavior, torch::kFloat);
    batch.mask =
        torch::ones({static_cast<int64_t>(targets.size())}, torch::kFloat);
    batch.sequence_ids = torch::tensor(sequence_ids, torch::kLong);
    batch.rewards = torch::tensor(rewards, torch::kFloat);
    batch.group_ids = torch::tensor(group_ids, torch::kLong);
    batch.entropy = logprobs->entropy;
    ASSIGN_OR_RETURN(GrpoLossResult loss,
                     ComputeGrpoLoss(batch, options_.loss));
    stats.loss = loss.stats;

    ++step_;
    const double lr = LearningRate(step_);
    for (auto& group : optimizer_->adamw->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    stats.lr = lr;
    optimizer_->adamw->zero_grad();
    loss.loss.backward();
    stats.grad_norm = torch::nn::utils::clip_grad_norm_(optimizer_->parameters,
                                                        options_.max_grad_norm);
    optimizer_->adamw->step();
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("GRPO step", e);
  }
  stats.policy_version = ++version_;
  stats.step_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

double GrpoTrainer::LearningRate(int64_t step) const {
  if (options_.warmup_steps <= 0) return options_.lr;
  return options_.lr *
         std::min(1.0, static_cast<double>(step) / options_.warmup_steps);
}

namespace {

// The key torch::optim keeps a parameter's state under.
std::string StateKey(const at::Tensor& parameter) {
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
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

absl::StatusOr<std::shared_ptr<model::ModelWeights>>
GrpoTrainer::SnapshotWeights() const {
  torch::NoGradGuard no_grad;
  const auto weights = policy_->weights();
  return weights->To(weights->device(), weights->config().dtype);
}

}  // namespace tandem::trainer
