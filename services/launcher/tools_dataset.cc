#include "services/launcher/tools_dataset.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/chat_template.h"
#include "common/task/tools_demonstration.h"
#include "common/task/tools_task.h"
#include "common/task/tools_tokenizer.h"

namespace tandem::launcher {

absl::Status WriteToolsDataset(const std::string& path, int64_t count,
                               uint64_t seed) {
  task::ToolsTaskOptions options;
  options.digits = kToolsDigits;
  options.seed = seed;
  ASSIGN_OR_RETURN(const task::ToolsTask tools,
                   task::ToolsTask::Create(options));
  ASSIGN_OR_RETURN(const chat::ChatTemplate tmpl,
                   chat::ChatTemplate::Parse(task::ToolsChatTemplate(),
                                             "tools chat_template"));
  std::ofstream out(path, std::ios::trunc);
  for (int64_t i = 0; i < count && out; ++i) {
    const task::ToolsProblem problem =
        tools.Sample(task::Split::kTrain, static_cast<uint64_t>(i));
    ASSIGN_OR_RETURN(const std::string prompt,
                     task::RenderToolsPrompt(tmpl, problem));
    out << task::ToolsDatasetRow(prompt, problem) << "\n";
  }
  out.flush();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tandem::launcher
