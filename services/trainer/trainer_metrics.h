#pragma once

// The trainer daemon's metric families, declared once here: TrainerMetrics
// (versions, trained tokens, loss and reward, step time, staleness, held-out
// accuracy, the publish protocol and resumes) holds TrainerStepMetrics (the
// rest of one optimizer step's GrpoStepStats). Gauges hold the last step's
// value. Thread-safe as the prometheus-cpp metrics they hold.

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/trainer/rl/grpo_trainer.h"

namespace tandem::trainer {

class TrainerStepMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  explicit TrainerStepMetrics(prometheus::Registry& registry);

  void Record(const GrpoStepStats& stats);
  // A step skipped for a non-finite reward, loss or gradient norm
  // (tandem_trainer_nonfinite_steps_total{quantity}).
  void RecordNonFinite(const GrpoStepStats& stats);
  // A group of a pulled batch left out of its step because a token id was
  // outside the policy's vocabulary
  // (tandem_trainer_groups_refused_total{reason="token_id"}).
  void RecordRefusedGroup();

  // Completion tokens trained per second of the step; 0 for a zero-length
  // step.
  static double TokensPerSecond(const GrpoStepStats& stats);

 private:
  prometheus::Gauge& tokens_per_second_;
  prometheus::Gauge& reward_std_;
  prometheus::Gauge& clip_fraction_;
  prometheus::Gauge& kl_;
  prometheus::Gauge& entropy_;
  prometheus::Gauge& ratio_mean_;
  prometheus::Gauge& effective_sample_size_;
  prometheus::Gauge& grad_norm_;
  prometheus::Gauge& learning_rate_;
  prometheus::Family<prometheus::Counter>& nonfinite_steps_;
  prometheus::Counter& refused_token_id_;
  // {outcome="trained" | "dropped"}: uniform groups stepped on, or left out
  // by training.dynamic_sampling.
  prometheus::Family<prometheus::Counter>& uniform_groups_;
  prometheus::Counter& uniform_trained_;
  prometheus::Counter& uniform_dropped_;
  // Groups that got their reference completion (training.guide_failed_groups).
  prometheus::Counter& guided_groups_;
};

class TrainerMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  explicit TrainerMetrics(prometheus::Registry& registry);

  // A step whose version the coordinator acknowledged: the version, tokens,
  // loss, reward, step time, staleness and the step's own families.
  void RecordStep(const GrpoStepStats& stats);
  // A held-out evaluation of `version`.
  void RecordHeldout(double accuracy, uint64_t version);

  prometheus::Gauge& policy_version;
  // PublishPolicyVersion calls sent again after a transport error; versions
  // the coordinator refused.
  prometheus::Counter& publish_retries;
  prometheus::Counter& publishes_refused;
  // At the trainer's start (ResumeTraining): groups trained after the
  // checkpoint it resumed from, queued again or lost.
  prometheus::Gauge& resume_groups_requeued;
  prometheus::Gauge& resume_groups_lost;
  // SaveCheckpoint calls refused by mutual-TLS authorization, by reason:
  // unauthenticated, wrong_role.
  prometheus::Family<prometheus::Counter>& auth_refused;
  TrainerStepMetrics step;

 private:
  prometheus::Counter& trained_tokens_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& reward_mean_;
  prometheus::Histogram& step_seconds_;
  prometheus::Histogram& staleness_;
  prometheus::Gauge& heldout_accuracy_;
  prometheus::Gauge& heldout_version_;
};

}  // namespace tandem::trainer
