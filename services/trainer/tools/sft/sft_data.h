#pragma once

// Training sequences of the supervised warm start and their packing.
//
// An arithmetic problem becomes the token sequence
//   [<|bos|>] + prompt ("123+456=") + answer ("579") + [<|eos|>]
// which is exactly what the rollout worker sees (the coordinator sends
// [<|bos|>] + prompt, generation stops at <|eos|>) followed by what the
// `arith` verifier accepts. The loss covers the answer and <|eos|> tokens
// only: the prompt is given, so the model is never asked to predict it.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/task/arith_task.h"
#include "common/task/tools_demonstration.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::trainer::sft {

struct SftExample {
  std::vector<int32_t> tokens;
  // Tokens [target_begin, tokens.size()) are the supervised targets (the
  // answer and <|eos|>); they are predicted from the positions before them.
  int64_t target_begin = 0;
  // When not empty, the supervised targets are these [begin, end) token
  // ranges instead (in order, disjoint, begin >= 1): the model's turns of a
  // multi-turn demonstration, the environment's tokens between them given
  // but not predicted. target_begin is then ignored.
  std::vector<std::pair<int64_t, int64_t>> target_spans;
};

// [<|bos|>] + the tokens of problem.prompt: the rollout worker's prompt.
std::vector<int32_t> PromptTokens(const tokenizer::Tokenizer& tokenizer,
                                  const task::ArithProblem& problem);

// The full supervised sequence of `problem` (see the file comment).
SftExample MakeSftExample(const tokenizer::Tokenizer& tokenizer,
                          const task::ArithProblem& problem);

// A tools episode's demonstration (common/task/tools_demonstration.h): its
// model spans are the targets.
SftExample MakeToolsSftExample(const task::ToolsDemonstration& demo);

// Examples packed into one sequence of T tokens for
// DecoderModel::ForwardPacked, plus the supervised positions.
struct PackedBatch {
  at::Tensor input_ids;     // [T] int64
  at::Tensor position_ids;  // [T] int64, restarting at 0 per example
  at::Tensor cu_seqlens;    // [B + 1] int64
  // The loss reads logits[loss_positions[i]] against loss_targets[i]; the
  // positions are the ones just before each target token.
  at::Tensor loss_positions;  // [N] int64
  at::Tensor loss_targets;    // [N] int64
};

// Packs `examples` (at least one, each with a target; spans in order,
// disjoint and inside [1, tokens]). InvalidArgument otherwise, naming the
// example.
absl::StatusOr<PackedBatch> PackExamples(absl::Span<const SftExample> examples);

}  // namespace tandem::trainer::sft
