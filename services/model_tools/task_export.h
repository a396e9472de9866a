#pragma once

// `tandem-model task`: the built-in arithmetic task's problems as JSONL, so
// that programs outside Tandem (tests/bench/peer_trl.py) train and evaluate
// on exactly the problems Tandem's coordinator hands out and its trainer
// evaluates on. The train/held-out split is the C++ one (a hash of the
// prompt, common/task/arith_task.h); nothing outside C++ reimplements it.

#include <cstdint>
#include <iosfwd>
#include <string>

#include "absl/status/status.h"

namespace tandem::model_tools {

struct TaskExportOptions {
  // "train" or "heldout".
  std::string split = "train";
  // Problems written: the first `count` of the split's seeded stream.
  int64_t count = 2048;
  // As the coordinator's dataset.seed / the trainer's eval.seed.
  uint64_t seed = 0;
  // As dataset.arith_digits / eval.arith_digits.
  int digits = 3;
  // As dataset.arith_subtraction / eval.arith_subtraction.
  bool subtraction = false;
};

// Writes one line {"prompt":"123+456=","answer":"579","id":"arith-123+456"}
// per problem, in stream order: with split "train" these are the prompts
// the coordinator's built-in source hands out in that order (index 0
// first); with "heldout" the problems the trainer's held-out evaluation
// scores (eval.problems of them). Errors name the bad option.
absl::Status ExportTask(const TaskExportOptions& options, std::ostream& out);

}  // namespace tandem::model_tools
