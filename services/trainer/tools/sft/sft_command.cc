#include "services/trainer/tools/sft/sft_command.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "services/trainer/tools/sft/sft_trainer.h"

namespace tandem::trainer::sft {

int RunSftCommand(int argc, char** argv) {
  SftOptions o;
  std::string schedule = "constant";
  CLI::App app{
      "Supervised warm start of the built-in tiny model on the built-in "
      "arithmetic task; writes a Hugging Face model directory."};
  app.add_option("--output", o.output_dir, "Checkpoint directory")->required();
  app.add_option("--task", o.task,
                 "arith (single answers) or tools (calculator episodes)")
      ->capture_default_str();
  app.add_option("--digits", o.digits, "Operand digits")->capture_default_str();
  app.add_option("--subtraction", o.subtraction,
                 "Include '-' problems (as the coordinator's "
                 "dataset.arith_subtraction)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Init and data seed")->capture_default_str();
  app.add_option("--steps", o.max_steps, "Maximum optimizer steps")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Problems per step")
      ->capture_default_str();
  app.add_option("--lr", o.lr, "Peak AdamW learning rate")
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "Linear warmup steps")
      ->capture_default_str();
  app.add_option("--schedule", schedule, "constant or cosine (after warmup)")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "Gradient-norm clip (0: off)")
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "Steps between evaluations")
      ->capture_default_str();
  app.add_option("--eval-problems", o.eval_problems,
                 "Held-out problems per evaluation")
      ->capture_default_str();
  app.add_option("--target-accuracy", o.target_accuracy,
                 "Stop at the first evaluation at or above this")
      ->capture_default_str();
  app.add_option("--max-accuracy", o.max_accuracy,
                 "Never save a model above this held-out accuracy")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "torch threads (0: default)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  o.schedule =
      schedule == "cosine" ? LrSchedule::kCosine : LrSchedule::kConstant;

  std::printf("sft: %d-digit %s, output %s\n", o.digits,
              o.task == "tools" ? "multiplication with the calculator"
              : o.subtraction   ? "addition and subtraction"
                                : "addition",
              o.output_dir.c_str());
  std::fflush(stdout);
  absl::StatusOr<SftResult> result = RunSft(o, [](const SftCurvePoint& p) {
    // Step 0 is the initial model: no training loss yet.
    const std::string loss = std::isnan(p.loss)
                                 ? std::string("     -")
                                 : absl::StrFormat("%.4f", p.loss);
    std::printf("sft: step %5lld  loss %s  heldout_accuracy %.3f  %.1fs\n",
                static_cast<long long>(p.step), loss.c_str(),
                p.heldout_accuracy, p.seconds);
    std::fflush(stdout);
  });
  if (!result.ok()) {
    std::fprintf(stderr, "sft: %s\n", result.status().ToString().c_str());
    return 1;
  }
  if (result->from_cache) {
    std::printf(
        "sft: %s already holds a finished checkpoint for these options "
        "(step %lld, heldout_accuracy %.3f); not training\n",
        o.output_dir.c_str(), static_cast<long long>(result->saved_step),
        result->saved_accuracy);
    return 0;
  }
  if (!result->reached_target) {
    std::printf(
        "sft: warning: no evaluation landed in [%.2f, %.2f]; saved the best "
        "one not above %.2f\n",
        o.target_accuracy, o.max_accuracy, o.max_accuracy);
  }
  std::printf(
      "sft: saved step %lld (heldout_accuracy %.3f) to %s after %.1fs\n",
      static_cast<long long>(result->saved_step), result->saved_accuracy,
      o.output_dir.c_str(), result->train_seconds);
  return 0;
}

}  // namespace tandem::trainer::sft
