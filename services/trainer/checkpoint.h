#pragma once

// Trainer checkpoints on disk: what a restarted trainer needs to take
// exactly the step an uninterrupted one would take, and a Hugging Face
// export of the policy.
//
//   <checkpoint_dir>/
//     latest -> step-120         symlink, replaced atomically (rename)
//     step-40/PINNED             a pinned checkpoint (the SaveCheckpoint RPC):
//                                never pruned, not counted in `keep`
//     step-100/                  older checkpoints, up to `keep` unpinned
//     step-120/
//       hf/config.json           the policy as a Hugging Face directory:
//       hf/model.safetensors     fp32 master weights (LoadHfModel reads it)
//       hf/tokenizer.json ...    tokenizer files, when the model had them
//       optimizer.safetensors    AdamW moments "exp_avg/<name>",
//                                "exp_avg_sq/<name>" (F32); metadata
//                                "step/<name>" = AdamW step count
//       trainer_state.json       step, policy version, learning rate
//                                schedule position, CPU RNG state, config
//                                and its hash, size and CRC-32C of every
//                                other file (written last)
//     tmp-121/                   a checkpoint being written (never read;
//                                removed by the next write)
//
// A checkpoint is written into tmp-<step>, every file fsync'ed, then the
// directory is renamed to step-<step> and `latest` re-pointed, so a crash at
// any moment leaves `latest` naming a complete checkpoint. The exported
// policy of the newest checkpoint is always at <checkpoint_dir>/latest/hf.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/trainer/rl/grpo_trainer.h"

namespace tandem::trainer {

inline constexpr char kLatestCheckpointLink[] = "latest";
inline constexpr char kCheckpointHfDir[] = "hf";
inline constexpr char kCheckpointOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kCheckpointStateFile[] = "trainer_state.json";
// Present in a step-* directory that rotation must never remove; holds why.
inline constexpr char kCheckpointPinFile[] = "PINNED";

struct CheckpointWriteOptions {
  // Parent directory; created if missing.
  std::string dir;
  // Checkpoints kept (the newest ones); older step-* directories are
  // removed after a successful write. >= 1.
  int64_t keep = 2;
  // Tokenizer files (tokenizer.json, ...) copied into hf/ from this
  // Hugging Face directory, when non-empty.
  std::string tokenizer_dir;
  // Writes the built-in arithmetic task's tokenizer.json into hf/ (the
  // built-in model has no directory to copy from).
  bool builtin_tokenizer = false;
  // The training configuration as a JSON object, stored with its hash so a
  // resume under a different configuration is noticed.
  std::string training_config_json = "{}";
};

struct WrittenCheckpoint {
  std::string path;  // <dir>/step-<step>
  int64_t step = 0;
  uint64_t policy_version = 0;
  uint64_t bytes = 0;  // all files written
  double seconds = 0.0;
};

// Writes a checkpoint of `trainer` (master weights, optimizer state, step,
// version, RNG state) as described above, then removes all but the newest
// `keep` unpinned step-* directories (never the one just written). An
// existing <dir>/step-<step> is replaced; a pinned one is kept as
// pinned-step-<step>-<unix ms> (a warning says so).
// Not thread-safe with respect to `trainer`: call from its training thread
// or after it stopped.
absl::StatusOr<WrittenCheckpoint> WriteCheckpoint(
    const GrpoTrainer& trainer, const CheckpointWriteOptions& options);

// A checkpoint read back and verified.
struct LoadedCheckpoint {
  std::string path;
  std::string hf_dir;  // <path>/hf, for LoadHfModel / model::LoadModel
  GrpoTrainerState state;
  // torch's default CPU generator state (opaque bytes).
  std::string cpu_rng_state;
  std::string training_config_json;
  std::string config_hash;
};

// The checkpoint `latest` names in `dir`. NotFound when `dir` or its
// `latest` does not exist (nothing to resume); FailedPrecondition naming the
// link when it points to a directory that does not exist.
absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir);

// Marks the checkpoint directory `path` as pinned (the PINNED file holds
// `reason`): later writes never prune it. An operator removes it by hand.
// NotFound when `path` is not a checkpoint directory.
absl::Status PinCheckpoint(const std::string& path, absl::string_view reason);

// Reads and verifies the checkpoint at `path` (a step-* directory): every
// file listed in trainer_state.json must exist with its recorded size and
// CRC-32C, and the optimizer file must parse. Errors are DataLoss (corrupt,
// truncated or missing file) or InvalidArgument (malformed contents) and
// name the file, e.g.
//   "/ckpt/step-40/hf/model.safetensors: crc32c 0x1a2b3c4d, expected
//    0x5e6f7a8b (trainer_state.json): the checkpoint is corrupt".
// The weights themselves are read by LoadHfModel(hf_dir).
absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& path);

// Restores the optimizer state, step, version and CPU RNG state of a
// trainer created from `checkpoint.hf_dir`'s weights.
absl::Status RestoreFromCheckpoint(const LoadedCheckpoint& checkpoint,
                                   GrpoTrainer* trainer);

// CRC-32C of a whole file (as recorded in trainer_state.json). Errors name
// the file.
absl::StatusOr<uint32_t> FileCrc32c(const std::string& path);

}  // namespace tandem::trainer
