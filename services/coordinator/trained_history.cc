#include "services/coordinator/trained_history.h"

#include <algorithm>

namespace tandem::coordinator {

TrainedHistory::TrainedHistory(uint64_t retained_versions,
                               uint64_t remembered_versions)
    : retained_versions_(std::max<uint64_t>(retained_versions, 1)),
      remembered_versions_(
          std::max<uint64_t>(remembered_versions, retained_versions_)) {}

void TrainedHistory::Add(uint64_t version,
                         std::vector<std::unique_ptr<GroupState>> groups) {
  Entry& entry = entries_[version];
  entry.groups += groups.size();
  for (auto& group : groups) entry.retained.push_back(std::move(group));
  Trim();
}

void TrainedHistory::Trim() {
  if (entries_.empty()) return;
  const uint64_t newest = entries_.rbegin()->first;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (newest - it->first >= remembered_versions_) {
      forgotten_before_ = std::max(forgotten_before_, it->first + 1);
      it = entries_.erase(it);
      continue;
    }
    if (newest - it->first >= retained_versions_) it->second.retained.clear();
    ++it;
  }
}

TrainedHistory::Rewound TrainedHistory::RewindTo(uint64_t version) {
  Rewound rewound;
  rewound.complete = forgotten_before_ <= version + 1;
  for (auto it = entries_.upper_bound(version); it != entries_.end();) {
    Entry& entry = it->second;
    rewound.dropped += entry.groups - entry.retained.size();
    for (auto& group : entry.retained) {
      rewound.groups.push_back(std::move(group));
    }
    it = entries_.erase(it);
  }
  return rewound;
}

void TrainedHistory::AppendSnapshot(
    std::vector<journal::Record>* records) const {
  for (const auto& [version, entry] : entries_) {
    journal::TrainedVersion* out =
        records->emplace_back().mutable_trained_version();
    out->set_policy_version(version);
    out->set_groups(static_cast<uint32_t>(entry.groups));
    for (const auto& group : entry.retained) {
      *out->add_retained() = ToJournal(*group);
    }
  }
}

void TrainedHistory::Restore(const journal::TrainedVersion& record,
                             uint32_t group_size) {
  Entry& entry = entries_[record.policy_version()];
  entry.groups = record.groups();
  entry.retained.clear();
  for (const auto& group : record.retained()) {
    entry.retained.push_back(FromJournal(group, group_size));
  }
  Trim();
}

}  // namespace tandem::coordinator
