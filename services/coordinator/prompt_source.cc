#include "services/coordinator/prompt_source.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/task/arith_task.h"
#include "common/task/arith_tokenizer.h"
#include "services/coordinator/jsonl_dataset.h"

namespace tandem::coordinator {
namespace {

class ArithPromptSource : public PromptSource {
 public:
  ArithPromptSource(task::ArithTask task,
                    std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                    bool add_bos)
      : task_(std::move(task)),
        tokenizer_(std::move(tokenizer)),
        add_bos_(add_bos) {}

  std::optional<Prompt> Next() override {
    task::ArithProblem problem = task_.Sample(task::Split::kTrain, cursor_);
    Prompt prompt;
    // The cursor makes ids unique even when the stream repeats a problem.
    prompt.id = absl::StrCat(problem.id, "#", cursor_);
    ++cursor_;
    prompt.text = problem.prompt;
    if (add_bos_) prompt.token_ids.push_back(task::kArithBosId);
    for (int32_t id : tokenizer_->Encode(problem.prompt)) {
      prompt.token_ids.push_back(id);
    }
    prompt.verifier = "arith";
    prompt.metadata["answer"] = problem.answer;
    prompt.metadata["end_marker"] = task::kArithEosToken;
    prompt.reference_completion_ids = tokenizer_->Encode(problem.answer);
    prompt.reference_completion_ids.push_back(task::kArithEosId);
    return prompt;
  }

  uint64_t cursor() const override { return cursor_; }

  std::string Describe() const override {
    return absl::StrCat("builtin_arith (digits ", task_.options().digits,
                        task_.options().subtraction ? ", + and -" : ", +",
                        ", seed ", task_.options().seed, ")");
  }

  std::vector<int32_t> stop_token_ids() const override {
    return {task::kArithEosId};
  }

  int32_t default_max_tokens() const override {
    // Sign, digits + 1 of a sum, and the end token.
    return task_.options().digits + 3;
  }

 private:
  task::ArithTask task_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  const bool add_bos_;
  uint64_t cursor_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PromptSource>> NewArithPromptSource(
    const DatasetOptions& options) {
  task::ArithTaskOptions task_options;
  task_options.digits = static_cast<int>(options.arith_digits);
  task_options.subtraction = options.arith_subtraction;
  task_options.seed = static_cast<uint64_t>(options.seed);
  ASSIGN_OR_RETURN(task::ArithTask task, task::ArithTask::Create(task_options));
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                   task::LoadArithTokenizer());
  return std::unique_ptr<PromptSource>(new ArithPromptSource(
      std::move(task), std::move(tokenizer), options.add_bos));
}

absl::StatusOr<std::unique_ptr<PromptSource>> NewPromptSource(
    const DatasetOptions& options) {
  if (options.kind == "builtin_arith") return NewArithPromptSource(options);
  if (options.kind == "jsonl") return NewJsonlPromptSource(options);
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.kind: unknown kind \"", options.kind,
                   "\" (expected builtin_arith or jsonl)"));
}

}  // namespace tandem::coordinator
