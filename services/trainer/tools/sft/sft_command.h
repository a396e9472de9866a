#pragma once

// `tandem-trainer sft`: the command-line front of RunSft (sft_trainer.h).
//
//   tandem-trainer sft --output DIR [--digits 3] [--seed 0] [--steps 4000]
//       [--batch-size 64] [--lr 3e-3] [--eval-every 50]
//       [--eval-problems 256] [--target-accuracy 0.45]
//       [--max-accuracy 0.7] [--threads 1] ...
//
// The defaults are the demo's warm start (sft::SftOptions).
//
// Prints one line per evaluation and a summary; when DIR already holds a
// finished checkpoint trained with the same options it says so and exits 0
// without training.

namespace tandem::trainer::sft {

// argv[0] names the command (e.g. "tandem-trainer sft"); the flags follow.
// Returns the process exit code: 0 on success (including a reused
// checkpoint), 1 on errors, 2 on bad flags (after printing usage).
int RunSftCommand(int argc, char** argv);

}  // namespace tandem::trainer::sft
