#pragma once

// `tandem-trainer export`: writes the policy of a trainer checkpoint as a
// Hugging Face directory (config.json, model.safetensors, tokenizer files)
// in the dtype asked for. Every checkpoint already holds one in fp32 at
// <step dir>/hf; this converts (e.g. to bfloat16) and copies it elsewhere.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace tandem::trainer {

struct ExportOptions {
  // A step-* checkpoint directory, or a checkpoint_dir (its `latest` is
  // exported).
  std::string checkpoint;
  // Instead of a checkpoint: the built-in tiny model with random weights
  // from `seed` and the arithmetic tokenizer (what model.path "" loads),
  // e.g. to start a cluster on bfloat16 weights.
  bool builtin = false;
  int64_t seed = 1;
  std::string output;
  // "float32" or "bfloat16".
  std::string dtype = "float32";
};

// Verifies the checkpoint (ReadCheckpoint), loads its policy and writes it
// to options.output. Returns the checkpoint directory exported (a
// description of the built-in model with options.builtin).
absl::StatusOr<std::string> ExportCheckpoint(const ExportOptions& options);

// `tandem-trainer export (--checkpoint DIR | --builtin [--seed N])
//  --output DIR [--dtype D]`;
// argv[0] is "export". Returns the process exit code.
int RunExportCommand(int argc, char** argv);

}  // namespace tandem::trainer
