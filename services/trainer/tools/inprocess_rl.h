#pragma once

// GRPO on the built-in arithmetic task with an in-process rollout: no
// daemons, no staleness. Each step samples `prompts_per_step` training
// problems x `group_size` completions with the rollout engine on the
// current policy, rewards exact answers (what the `arith` verifier
// rewards), and takes one GrpoTrainer step; every `eval_every` steps it
// measures greedy held-out accuracy. It shows the algorithm learns before
// the distributed system is involved, and calibrates the demo's settings
// (`tandem-trainer rl-inprocess`).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/trainer/rl/grpo_trainer.h"

namespace tandem::trainer {

struct InProcessRlOptions {
  // Hugging Face directory of the start policy (e.g. a warm start).
  std::string model_path;
  int64_t torch_threads = 1;
  int digits = 3;
  bool subtraction = false;
  uint64_t seed = 0;
  int64_t steps = 200;
  int64_t prompts_per_step = 16;
  int32_t group_size = 8;
  double temperature = 1.0;
  int64_t eval_every = 20;
  int64_t eval_problems = 256;
  GrpoTrainerOptions grpo;
};

struct InProcessRlPoint {
  int64_t step = 0;
  double heldout_accuracy = 0.0;
  double reward_mean = 0.0;  // over the steps since the previous point
  double seconds = 0.0;      // since the start
  // Means over the steps since the previous point (0 at step 0).
  double entropy_mean = 0.0;   // per-token entropy of the trained tokens
  double clip_fraction = 0.0;  // tokens whose gradient was clipped
  double ratio_mean = 0.0;     // new / behavior probability
  double grad_norm = 0.0;      // before clipping
  // Fraction of groups whose samples did not all get the same reward (the
  // only groups with a non-zero advantage).
  double signal_fraction = 0.0;
};

struct InProcessRlResult {
  std::vector<InProcessRlPoint> curve;  // step 0 = the start policy
  double generate_seconds = 0.0;
  double train_seconds = 0.0;
};

// Runs the loop; `on_point` (optional) sees every evaluation as it comes.
absl::StatusOr<InProcessRlResult> RunInProcessRl(
    const InProcessRlOptions& options,
    const std::function<void(const InProcessRlPoint&)>& on_point = nullptr);

// `tandem-trainer rl-inprocess`: flags → RunInProcessRl, one line per
// evaluation. Returns the exit code.
int RunInProcessRlCommand(int argc, char** argv);

}  // namespace tandem::trainer
