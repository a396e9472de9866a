#pragma once

// Metric families of one optimizer step of the trainer daemon (the
// GrpoStepStats a GrpoTrainer returns). Gauges hold the last step's value.
// Thread-safe as the prometheus-cpp metrics it holds.

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
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
};

}  // namespace tandem::trainer
