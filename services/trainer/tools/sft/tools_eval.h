#pragma once

// Greedy held-out evaluation of the tools task (common/task/tools_task.h):
// whole episodes, decoded the way a rollout worker runs them.
//
//   1. From the worker's prompt, decode greedily until </tool_call>,
//      <|im_end|> or `max_turn_tokens`.
//   2. A turn that ended with <|im_end|> is the answer (the model did not
//      call the tool). A turn that ended with </tool_call> is parsed
//      (ParseToolCalls, Hermes); one `calculator` call's expression is
//      answered by the calculator tool the verifier hosts
//      (common/environment/calculator.h: the same observation text),
//      anything else by an error text,
//      and <|im_end|> plus the chat template's rendering of that tool
//      message is appended, as the worker does; then decode the answer turn
//      until <|im_end|>.
//   3. The answer turn is scored by ScoreToolsAnswer.
//
// Both rounds run on the rollout engine (engine::GenerateAll: continuous
// batching, KV cache, temperature 0), the second round re-prefilling each
// episode's prefix. Runs under inference mode and never changes the model.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/chat/chat_template.h"
#include "common/model/decoder_model.h"
#include "common/task/tools_task.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::trainer::sft {

struct ToolsEvalResult {
  int64_t correct = 0;
  // Episodes whose first turn was a well-formed calculator call.
  int64_t called_tool = 0;
  int64_t total = 0;
  double accuracy() const {
    return total == 0 ? 0.0 : static_cast<double>(correct) / total;
  }
  double tool_use() const {
    return total == 0 ? 0.0 : static_cast<double>(called_tool) / total;
  }
};

// Evaluates `problems` (see the file comment). LibTorch errors come back
// as InternalError, template errors as they are.
absl::StatusOr<ToolsEvalResult> EvaluateToolsEpisodes(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    const chat::ChatTemplate& tmpl,
    absl::Span<const task::ToolsProblem> problems, int64_t max_turn_tokens = 96,
    int64_t batch_size = 256);

}  // namespace tandem::trainer::sft
