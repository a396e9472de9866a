#pragma once

// Conversion of a training batch from the coordinator (PullTrainingBatch)
// into the GrpoTrainer's groups, with the checks the model needs that the
// coordinator cannot make: it does not know the policy's vocabulary, and a
// token id outside [0, vocab_size) would index past the embedding table.
// A group with such an id (in its prompt or any completion) is left out of
// the step, with a reason naming the group, the field, the position, the
// value and the vocabulary size; the rest of the batch is trained.

#include <cstdint>
#include <string>
#include <vector>

#include "services/trainer/rl/grpo_batch.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::trainer {

struct ConvertedBatch {
  std::vector<ScoredPromptGroup> groups;
  // Ids of the groups in `groups`, in order.
  std::vector<std::string> group_ids;
  // One line per group left out (its id first).
  std::vector<std::string> refused;
};

// REQUIRES: vocab_size > 0.
ConvertedBatch ConvertTrainingBatch(
    const tandem::v1::PullTrainingBatchResponse& batch, int64_t vocab_size);

}  // namespace tandem::trainer
