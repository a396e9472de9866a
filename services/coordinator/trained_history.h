#pragma once

// TrainedHistory remembers what each published policy version trained, so
// that a trainer which resumes from an older checkpoint loses nothing
// silently: the groups of the versions after its checkpoint are gone from
// the weights, and RewindTo() hands back the ones still trainable (to be
// queued again) and counts the rest as lost.
//
// Per version it keeps the number of groups trained (the newest
// `remembered_versions` versions) and the groups themselves for the newest
// `retained_versions` versions: a group committed into version u was pulled
// by a trainer at u - 1 and is at most max_lag versions old then, so once
// the latest version is past u + max_lag it can never be trained again and
// only its count matters (retained_versions = max_lag + 1).
//
// Not thread-safe: the GroupLedger calls it under its mutex.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "services/coordinator/group_state.h"
#include "services/coordinator/journal.pb.h"

namespace tandem::coordinator {

class TrainedHistory {
 public:
  TrainedHistory(uint64_t retained_versions, uint64_t remembered_versions);

  // Records that `version` trained `groups` (appended to what the version
  // already trained: a trainer using CommitTrainingBatch may commit several
  // batches into one version).
  void Add(uint64_t version, std::vector<std::unique_ptr<GroupState>> groups);

  struct Rewound {
    // Groups of the forgotten versions still held, oldest version first.
    std::vector<std::unique_ptr<GroupState>> groups;
    // Groups of the forgotten versions whose data is no longer held.
    uint64_t dropped = 0;
    // False when versions after `version` may predate what is remembered
    // (then `dropped` is a lower bound).
    bool complete = true;
  };
  // Forgets every version after `version` and returns what they trained.
  Rewound RewindTo(uint64_t version);

  // Compaction records (TrainedVersion), oldest first, and their replay.
  void AppendSnapshot(std::vector<journal::Record>* records) const;
  void Restore(const journal::TrainedVersion& record, uint32_t group_size);

  uint64_t versions() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t groups = 0;
    std::vector<std::unique_ptr<GroupState>> retained;
  };
  void Trim();

  const uint64_t retained_versions_;
  const uint64_t remembered_versions_;
  std::map<uint64_t, Entry> entries_;
  // Entries before this version were forgotten (Trim); 0: none was.
  uint64_t forgotten_before_ = 0;
};

}  // namespace tandem::coordinator
