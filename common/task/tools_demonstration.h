#pragma once

// What the tools task (common/task/tools_task.h) looks like as tokens: the
// prompt a rollout worker is given, the supervised demonstration of a whole
// episode with the spans the model wrote, and the coordinator's dataset row.
//
// The demonstration is token for token what a worker running the episode
// with `environment.turn_stop_strings: ["</tool_call>"]` and
// `environment.turn_end: "<|im_end|>"` holds at its end:
//
//   prompt <|im_start|>user\n4821*7312<|im_end|>\n<|im_start|>assistant\n model
//   turn 1  <tool_call>{"name": "calculator", ...}</tool_call> environment
//   <|im_end|> + RenderContinuation([tool message])
//                 = <|im_end|>\n<|im_start|>tool\n35251152<|im_end|>\n
//                   <|im_start|>assistant\n
//   model turn 2  35251152<|im_end|>
//
// Only the model turns are trained on (model_spans); the prompt and the
// environment's tokens are given.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/task/tools_task.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::task {

struct ToolsDemonstration {
  std::vector<int32_t> tokens;
  // [begin, end) token ranges the model wrote, in order: the call turn and
  // the answer turn.
  std::vector<std::pair<int64_t, int64_t>> model_spans;
  // tokens[0, prompt_tokens) is the prompt.
  int64_t prompt_tokens = 0;
};

// The worker's prompt: the user message `problem.expression` rendered by
// `tmpl` with the generation prompt.
absl::StatusOr<std::string> RenderToolsPrompt(const chat::ChatTemplate& tmpl,
                                              const ToolsProblem& problem);

// The whole episode of `problem`, the tool's result being problem.answer
// (what the calculator returns for a*b). Errors come from the template.
absl::StatusOr<ToolsDemonstration> MakeToolsDemonstration(
    const tokenizer::Tokenizer& tokenizer, const chat::ChatTemplate& tmpl,
    const ToolsProblem& problem);

// One line of a coordinator `jsonl` dataset (no trailing newline):
// {"id": ..., "prompt": ..., "verifier": "exact",
//  "metadata": {"answer": ...}, "environment": "calculator"}.
std::string ToolsDatasetRow(const std::string& prompt,
                            const ToolsProblem& problem);

}  // namespace tandem::task
