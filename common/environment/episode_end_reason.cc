#include "common/environment/episode_end_reason.h"

#include "absl/strings/str_join.h"

namespace tandem::environment {

absl::string_view EndReasonLabel(tandem::v1::EpisodeEndReason reason,
                                 absl::string_view otherwise) {
  for (const EndReasonEntry& entry : kEndReasonTable) {
    if (entry.reason == reason) return entry.label;
  }
  return otherwise;
}

std::string EndReasonLabelList() {
  return absl::StrJoin(kEndReasonTable, ", ",
                       [](std::string* out, const EndReasonEntry& entry) {
                         out->append(entry.label.data(), entry.label.size());
                       });
}

}  // namespace tandem::environment
