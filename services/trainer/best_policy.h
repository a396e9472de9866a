#pragma once

// The best policy of a run by held-out accuracy, kept next to the
// checkpoints so a run that peaks and then dips still hands the user its
// best model, not only its last one:
//
//   <checkpoint_dir>/
//     best -> best-v1200           symlink, replaced atomically (rename)
//     best-v1200/config.json       the policy as a Hugging Face directory
//     best-v1200/model.safetensors (fp32 master weights; LoadHfModel and
//     best-v1200/tokenizer.json     `transformers` read it)
//     best-v1200/best.json         {"policy_version", "step", "accuracy",
//                                   "correct", "problems"}
//
// A new directory is written (files fsync'ed) and the link re-pointed
// before the previous best-v* is removed, so `best` always names a complete
// policy. The best so far survives a trainer restart (read back from
// best.json when the number of problems matches).
// Thread-compatible: the trainer calls it from its training thread.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "services/trainer/heldout_eval.h"

namespace tandem::model {
class ModelWeights;
}

namespace tandem::trainer {

inline constexpr char kBestPolicyLink[] = "best";
inline constexpr char kBestPolicyInfoFile[] = "best.json";

struct BestPolicyOptions {
  std::string checkpoint_dir;
  // As CheckpointWriteOptions: tokenizer files copied from this Hugging
  // Face directory, or the built-in arithmetic tokenizer written.
  std::string tokenizer_dir;
  bool builtin_tokenizer = false;
};

struct BestPolicy {
  uint64_t policy_version = 0;
  int64_t step = 0;
  double accuracy = 0.0;
  int64_t correct = 0;
  int64_t problems = 0;
  std::string path;  // <checkpoint_dir>/best-v<version>
};

class BestPolicyKeeper {
 public:
  // Reads back the best policy a previous trainer kept in the directory,
  // if any (ignored, with a warning, when unreadable).
  explicit BestPolicyKeeper(BestPolicyOptions options);

  // Writes `weights` as the new best policy when `result` is strictly more
  // accurate than the best so far (or there is none, or the best so far was
  // measured on another number of problems). Returns the new best, or
  // nullopt when it was not better. Errors name the file that could not be
  // written; the previous best is then still in place.
  absl::StatusOr<std::optional<BestPolicy>> Offer(
      const model::ModelWeights& weights, const HeldoutResult& result,
      int64_t step);

  const std::optional<BestPolicy>& best() const { return best_; }

 private:
  BestPolicyOptions options_;
  std::optional<BestPolicy> best_;
};

}  // namespace tandem::trainer
