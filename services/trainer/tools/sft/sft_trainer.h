#pragma once

// The supervised warm start of the built-in tiny model on the built-in
// arithmetic task (`tandem-trainer sft`).
//
// Trains from a seeded random init on train-split problems, with
// cross-entropy on the answer and <|eos|> tokens (sft_data.h), AdamW,
// linear warmup then a constant or cosine learning rate, and gradient-norm
// clipping. Every `eval_every` steps it measures greedy exact-match
// accuracy on the first `eval_problems` held-out problems and stops at the
// first evaluation with accuracy >= target_accuracy. The warm start is
// meant to land partway (RL needs room to improve), so it never saves a
// model above max_accuracy: when one evaluation jumps over the whole
// window, the best earlier evaluation not above max_accuracy is saved.
//
// Output directory (a Hugging Face model directory that the rollout
// worker and trainer load with LoadHfModel):
//   config.json, model.safetensors, tokenizer.json  the checkpoint
//   sft_curve.csv   step,loss,heldout_accuracy,seconds per evaluation
//   sft_meta.json   the options and result, written last: a directory
//                   whose meta matches the options is reused as is.
//
// Deterministic for fixed options up to floating-point reduction order,
// which depends on the number of torch threads (not part of the cache
// key).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace tandem::trainer::sft {

enum class LrSchedule { kConstant, kCosine };

// The defaults are the demo's warm start: tandem-local runs `tandem-trainer
// sft --output DIR` and tests build on SftOptions{}. They land just past the
// plateau where the model gets the units and hundreds digits but not the
// tens digit (~30% exact match, steps ~1400-2550 on this machine): RL from
// there learns quickly, RL from inside the plateau barely moves
// (docs/sft.md, docs/demo.md).
struct SftOptions {
  // Where the checkpoint goes (created if missing).
  std::string output_dir;
  // "arith" (the default task) or "tools" (the multi-turn calculator task,
  // common/task/tools_task.h: demonstrations of whole episodes, trained on
  // the model's turns only, evaluated by greedy episodes (tools_eval.h);
  // `digits` in [2, 9], `subtraction` unused; the model gets the tools
  // tokenizer, its chat template and 256 positions).
  std::string task = "arith";
  // Task: operand digits and whether '-' problems are included (as the
  // coordinator's dataset.arith_digits / dataset.arith_subtraction).
  int digits = 3;
  bool subtraction = false;
  // Seeds the random init and the training problem stream.
  uint64_t seed = 0;
  // Upper bound on optimizer steps.
  int64_t max_steps = 4000;
  int64_t batch_size = 64;
  // Peak learning rate, reached after `warmup_steps` linear steps; cosine
  // then decays to lr * min_lr_ratio at max_steps.
  double lr = 3e-3;
  int64_t warmup_steps = 50;
  LrSchedule schedule = LrSchedule::kConstant;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  // Global gradient-norm clip; <= 0 disables clipping.
  double grad_clip = 1.0;
  int64_t eval_every = 50;
  int64_t eval_problems = 256;
  // Stop at the first evaluation >= target_accuracy; never save a model
  // above max_accuracy. Fractions in [0, 1].
  double target_accuracy = 0.45;
  double max_accuracy = 0.70;
  // torch intra-op threads; <= 0 keeps LibTorch's default. One by
  // default: on the shared 2-core machine two OpenMP threads spin against
  // the other processes and a step took ~10x longer (docs/sft.md).
  int threads = 1;
};

// Checks ranges; errors name the option and value.
absl::Status ValidateSftOptions(const SftOptions& options);

struct SftCurvePoint {
  int64_t step = 0;
  // Mean training loss of the steps since the previous evaluation (NaN at
  // step 0).
  double loss = 0.0;
  double heldout_accuracy = 0.0;
  // Wall time since training started.
  double seconds = 0.0;
};

struct SftResult {
  // True when output_dir already held a matching finished checkpoint and
  // nothing was trained.
  bool from_cache = false;
  // Whether an evaluation reached target_accuracy (without passing
  // max_accuracy); false when the run hit max_steps first or jumped over
  // the window.
  bool reached_target = false;
  int64_t saved_step = 0;
  double saved_accuracy = 0.0;
  double train_seconds = 0.0;
  // Evaluations of this run (empty when from_cache).
  std::vector<SftCurvePoint> curve;
};

// Trains and saves (or reuses, see the file comment). `on_eval`, when set,
// is called after each evaluation (for progress logs). Errors name what
// failed: option validation, LibTorch errors (InternalError), file writes.
absl::StatusOr<SftResult> RunSft(
    const SftOptions& options,
    const std::function<void(const SftCurvePoint&)>& on_eval = nullptr);

// model::BuiltinTinyModelConfig (the rollout worker's built-in shape) with
// the arithmetic task's bos/eos ids.
model::ModelConfig TinyModelConfig(int64_t vocab_size);

// The built-in shape with the tools tokenizer's vocabulary, no bos, eos
// <|im_end|>, and 256 positions (a whole episode is about 140 tokens).
model::ModelConfig ToolsTinyModelConfig();

}  // namespace tandem::trainer::sft
