#include "services/trainer/trainer_metrics.h"

namespace tandem::trainer {
namespace {

prometheus::Gauge& LastStepGauge(prometheus::Registry& registry,
                                 const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(
      {});
}

}  // namespace

TrainerStepMetrics::TrainerStepMetrics(prometheus::Registry& registry)
    : tokens_per_second_(LastStepGauge(
          registry, "tandem_trainer_tokens_per_second",
          "Completion tokens trained per second of the last step.")),
      reward_std_(LastStepGauge(
          registry, "tandem_trainer_reward_std",
          "Population standard deviation of the rewards of the last "
          "trained batch.")),
      clip_fraction_(LastStepGauge(
          registry, "tandem_trainer_clip_fraction",
          "Fraction of the last step's forwarded tokens whose PPO ratio was "
          "clipped (gradient zeroed). Forwarded: completions with a non-zero "
          "advantage, or all when none has one.")),
      kl_(LastStepGauge(
          registry, "tandem_trainer_kl",
          "Mean k3 KL estimate to the reference model over the last step's "
          "tokens; stays 0 while no reference model is configured.")),
      entropy_(LastStepGauge(
          registry, "tandem_trainer_entropy",
          "Mean entropy (nats) of the policy's next-token distribution over "
          "the last step's forwarded tokens (see clip_fraction).")),
      ratio_mean_(LastStepGauge(
          registry, "tandem_trainer_ratio_mean",
          "Mean importance ratio exp(new - behavior log-prob) over the "
          "last step's forwarded tokens (see clip_fraction).")),
      effective_sample_size_(LastStepGauge(
          registry, "tandem_trainer_effective_sample_size",
          "Normalised effective sample size (sum w)^2 / sum w^2 / M of the "
          "last step's importance weights; 1 when on-policy.")),
      grad_norm_(LastStepGauge(
          registry, "tandem_trainer_grad_norm",
          "Total gradient norm of the last step, before clipping.")),
      learning_rate_(
          LastStepGauge(registry, "tandem_trainer_learning_rate",
                        "Learning rate of the last optimizer step.")),
      nonfinite_steps_(
          prometheus::BuildCounter()
              .Name("tandem_trainer_nonfinite_steps_total")
              .Help("Optimizer steps skipped because a reward, their loss or "
                    "their gradient norm was NaN or infinite, by quantity "
                    "(reward, loss, grad_norm): no update, no new version, "
                    "batch not committed.")
              .Register(registry)),
      refused_token_id_(
          prometheus::BuildCounter()
              .Name("tandem_trainer_groups_refused_total")
              .Help("Groups of pulled batches left out of their step, by "
                    "reason: token_id (a prompt or completion token id "
                    "outside the policy's vocabulary, which would index "
                    "past the embedding table). The rest of the batch is "
                    "trained and committed.")
              .Register(registry)
              .Add({{"reason", "token_id"}})),
      uniform_groups_(
          prometheus::BuildCounter()
              .Name("tandem_trainer_uniform_groups_total")
              .Help("Trained batches' groups whose completions all got the "
                    "same reward (zero advantage: no policy gradient), by "
                    "outcome: trained (counted in the loss's denominators) "
                    "or dropped (left out of the step by "
                    "training.dynamic_sampling).")
              .Register(registry)),
      uniform_trained_(uniform_groups_.Add({{"outcome", "trained"}})),
      uniform_dropped_(uniform_groups_.Add({{"outcome", "dropped"}})),
      guided_groups_(
          prometheus::BuildCounter()
              .Name("tandem_trainer_guided_groups_total")
              .Help("Groups whose samples all failed and that were trained "
                    "with the dataset's reference completion added "
                    "(training.guide_failed_groups).")
              .Register(registry)
              .Add({})) {
  for (const char* quantity : {"reward", "loss", "grad_norm"}) {
    nonfinite_steps_.Add({{"quantity", quantity}});
  }
}

void TrainerStepMetrics::RecordNonFinite(const GrpoStepStats& stats) {
  nonfinite_steps_.Add({{"quantity", stats.nonfinite}}).Increment();
}

void TrainerStepMetrics::RecordRefusedGroup() { refused_token_id_.Increment(); }

double TrainerStepMetrics::TokensPerSecond(const GrpoStepStats& stats) {
  if (!(stats.step_seconds > 0.0)) return 0.0;
  return static_cast<double>(stats.trained_tokens) / stats.step_seconds;
}

void TrainerStepMetrics::Record(const GrpoStepStats& stats) {
  tokens_per_second_.Set(TokensPerSecond(stats));
  reward_std_.Set(stats.reward_std);
  clip_fraction_.Set(stats.loss.clip_fraction);
  kl_.Set(stats.loss.kl_mean);
  entropy_.Set(stats.loss.entropy_mean);
  ratio_mean_.Set(stats.loss.ratio_mean);
  effective_sample_size_.Set(stats.loss.effective_sample_size);
  grad_norm_.Set(stats.grad_norm);
  learning_rate_.Set(stats.lr);
  uniform_trained_.Increment(
      static_cast<double>(stats.uniform_groups - stats.dropped_uniform_groups));
  uniform_dropped_.Increment(static_cast<double>(stats.dropped_uniform_groups));
  guided_groups_.Increment(static_cast<double>(stats.guided_groups));
}

TrainerMetrics::TrainerMetrics(prometheus::Registry& registry)
    : policy_version(prometheus::BuildGauge()
                         .Name("tandem_policy_version")
                         .Help("Policy version of the trainer's weights.")
                         .Register(registry)
                         .Add({})),
      publish_retries(prometheus::BuildCounter()
                          .Name("tandem_trainer_publish_retries_total")
                          .Help("PublishPolicyVersion calls sent again "
                                "after a transport error (the coordinator "
                                "unreachable or restarting).")
                          .Register(registry)
                          .Add({})),
      publishes_refused(
          prometheus::BuildCounter()
              .Name("tandem_trainer_publishes_refused_total")
              .Help("Versions the coordinator refused (the trainer then "
                    "adopted the coordinator's numbering).")
              .Register(registry)
              .Add({})),
      resume_groups_requeued(
          prometheus::BuildGauge()
              .Name("tandem_trainer_resume_groups_requeued")
              .Help("At this trainer's start: groups trained after the "
                    "checkpoint it resumed from, queued again.")
              .Register(registry)
              .Add({})),
      resume_groups_lost(
          prometheus::BuildGauge()
              .Name("tandem_trainer_resume_groups_lost")
              .Help("At this trainer's start: groups trained after the "
                    "checkpoint it resumed from and too stale to train "
                    "again (lost from the weights).")
              .Register(registry)
              .Add({})),
      auth_refused(prometheus::BuildCounter()
                       .Name("tandem_trainer_auth_refused_total")
                       .Help("Calls refused by mutual-TLS authorization "
                             "(SaveCheckpoint needs the admin role; the "
                             "weight server's GetManifest and FetchWeights "
                             "the trainer, rollout or admin role), by "
                             "reason: unauthenticated, wrong_role. Always 0 "
                             "with tls.mode off.")
                       .Register(registry)),
      step(registry),
      trained_tokens_(prometheus::BuildCounter()
                          .Name("tandem_trainer_trained_tokens_total")
                          .Help("Completion tokens trained on.")
                          .Register(registry)
                          .Add({})),
      loss_(prometheus::BuildGauge()
                .Name("tandem_trainer_loss")
                .Help("Policy loss of the last step.")
                .Register(registry)
                .Add({})),
      reward_mean_(prometheus::BuildGauge()
                       .Name("tandem_trainer_reward_mean")
                       .Help("Mean reward of the last trained batch.")
                       .Register(registry)
                       .Add({})),
      step_seconds_(
          prometheus::BuildHistogram()
              .Name("tandem_trainer_step_seconds")
              .Help("Duration of one optimizer step.")
              .Register(registry)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{
                       0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})),
      staleness_(
          prometheus::BuildHistogram()
              .Name("tandem_trainer_staleness_versions")
              .Help("Versions between the trainer and the oldest "
                    "token of each trained sample.")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6,
                                                               8, 16})),
      heldout_accuracy_(
          prometheus::BuildGauge()
              .Name("tandem_trainer_heldout_accuracy")
              .Help("Greedy exact-match accuracy on the built-in task's "
                    "held-out problems at the last evaluation (eval.*).")
              .Register(registry)
              .Add({})),
      heldout_version_(prometheus::BuildGauge()
                           .Name("tandem_trainer_heldout_policy_version")
                           .Help("Policy version of the last held-out "
                                 "evaluation.")
                           .Register(registry)
                           .Add({})) {
  for (const char* reason : {"unauthenticated", "wrong_role"}) {
    auth_refused.Add({{"reason", reason}});
  }
}

void TrainerMetrics::RecordStep(const GrpoStepStats& stats) {
  policy_version.Set(static_cast<double>(stats.policy_version));
  trained_tokens_.Increment(static_cast<double>(stats.trained_tokens));
  loss_.Set(stats.loss.loss);
  reward_mean_.Set(stats.reward_mean);
  step_seconds_.Observe(stats.step_seconds);
  step.Record(stats);
  for (int64_t s : stats.staleness) staleness_.Observe(static_cast<double>(s));
}

void TrainerMetrics::RecordHeldout(double accuracy, uint64_t version) {
  heldout_accuracy_.Set(accuracy);
  heldout_version_.Set(static_cast<double>(version));
}

}  // namespace tandem::trainer
