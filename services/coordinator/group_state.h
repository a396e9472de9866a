#pragma once

// One group: a leased prompt and the group_size samples generated for it.
// Owned first by the GroupLedger (while leased and scoring), then by the
// TrainingQueue (ready and training). Plain data; not thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/coordinator/journal.pb.h"
#include "services/coordinator/prompt_source.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

struct GroupState {
  std::string group_id;
  std::string lease_id;
  // The rollout worker holding the lease.
  std::string member_id;
  std::shared_ptr<const Prompt> prompt;
  // The lease expires at this time unless renewed (while leased).
  absl::Time lease_deadline;
  // Coordinator's and worker's policy versions when the lease was granted.
  uint64_t dispatch_version = 0;
  uint64_t worker_version = 0;
  // Indexed by sample_index; set once.
  std::vector<std::optional<tandem::v1::Sample>> samples;
  std::vector<std::optional<tandem::v1::Score>> scores;
  uint32_t submitted = 0;
  uint32_t scored = 0;
  // Prompt plus completion tokens of all submitted samples.
  uint64_t tokens = 0;
  // Oldest and newest policy version of any generated token (set when the
  // group becomes ready).
  uint64_t min_version = 0;
  uint64_t max_version = 0;

  bool all_submitted() const { return submitted == samples.size(); }
  bool all_scored() const { return scored == samples.size(); }
};

// The group as the trainer receives it.
tandem::v1::ScoredGroup ToScoredGroup(const GroupState& group);

// Sets min_version / max_version from the samples' version spans; samples
// without spans count at the worker's version.
void ComputeVersionRange(GroupState* group);

// Journal form of a group and of a prompt, and back. FromJournal recomputes
// the counts and token total; `group_size` sizes the sample slots.
journal::Group ToJournal(const GroupState& group);
std::unique_ptr<GroupState> FromJournal(const journal::Group& group,
                                        uint32_t group_size);
journal::Prompt ToJournal(const Prompt& prompt);
Prompt FromJournal(const journal::Prompt& prompt);

}  // namespace tandem::coordinator
