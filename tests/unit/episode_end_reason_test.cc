// The table of episode end reasons (common/environment/episode_end_reason.h)
// covers every EpisodeEndReason the proto declares but UNSPECIFIED, once,
// with distinct labels; an unset or unknown reason gets the caller's label.

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "common/environment/episode_end_reason.h"

namespace tandem::environment {
namespace {

TEST_CASE(
    "every declared end reason but UNSPECIFIED has one entry with a "
    "distinct label") {
  const google::protobuf::EnumDescriptor* reasons =
      tandem::v1::EpisodeEndReason_descriptor();
  std::set<int> in_table;
  std::set<std::string> labels;
  for (const EndReasonEntry& entry : kEndReasonTable) {
    CHECK(in_table.insert(entry.reason).second);
    CHECK(labels.insert(std::string(entry.label)).second);
    CHECK(EndReasonLabel(entry.reason, "other") == entry.label);
  }
  for (int i = 0; i < reasons->value_count(); ++i) {
    const int number = reasons->value(i)->number();
    INFO(reasons->value(i)->name());
    CHECK(in_table.count(number) ==
          (number == tandem::v1::EPISODE_END_REASON_UNSPECIFIED ? 0 : 1));
  }
  CHECK(in_table.size() + 1 == static_cast<size_t>(reasons->value_count()));
}

TEST_CASE("an unset or unknown end reason gets the caller's label") {
  CHECK(EndReasonLabel(tandem::v1::EPISODE_END_REASON_UNSPECIFIED,
                       "environment") == "environment");
  CHECK(EndReasonLabel(static_cast<tandem::v1::EpisodeEndReason>(99),
                       "error") == "error");
}

TEST_CASE("the label list joins the table's labels in its order") {
  CHECK(EndReasonLabelList() ==
        "answered, environment, max_turns, observation_too_large, timeout, "
        "error");
}

}  // namespace
}  // namespace tandem::environment
