#include "services/model_tools/task_export.h"

#include <nlohmann/json.hpp>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/task/arith_task.h"

namespace tandem::model_tools {

absl::Status ExportTask(const TaskExportOptions& options, std::ostream& out) {
  task::Split split;
  if (options.split == "train") {
    split = task::Split::kTrain;
  } else if (options.split == "heldout") {
    split = task::Split::kHeldOut;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--split must be train or heldout, got '", options.split, "'"));
  }
  if (options.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--count must be >= 0, got ", options.count));
  }
  task::ArithTaskOptions task_options;
  task_options.digits = options.digits;
  task_options.subtraction = options.subtraction;
  task_options.seed = options.seed;
  absl::StatusOr<task::ArithTask> task = task::ArithTask::Create(task_options);
  if (!task.ok()) return task.status();
  for (int64_t i = 0; i < options.count; ++i) {
    const task::ArithProblem problem =
        task->Sample(split, static_cast<uint64_t>(i));
    out << nlohmann::json{{"prompt", problem.prompt},
                          {"answer", problem.answer},
                          {"id", problem.id}}
               .dump()
        << "\n";
  }
  return out ? absl::OkStatus()
             : absl::DataLossError("writing the problems failed");
}

}  // namespace tandem::model_tools
