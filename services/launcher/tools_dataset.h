#pragma once

// The dataset of `tandem-local --task tools`: train-split problems of the
// tools task (common/task/tools_task.h) as coordinator JSONL rows that name
// the `calculator` environment, each prompt rendered with the task's chat
// template (common/task/tools_demonstration.h).

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tandem::launcher {

// Operand digits of the tools task that tandem-local runs; the warm start
// and the dataset agree on it.
inline constexpr int kToolsDigits = 4;

// Writes the first `count` train problems (seed `seed`) to `path`, one row a
// line. Errors name the path.
absl::Status WriteToolsDataset(const std::string& path, int64_t count,
                               uint64_t seed);

}  // namespace tandem::launcher
