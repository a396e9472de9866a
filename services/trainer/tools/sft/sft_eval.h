#pragma once

// Greedy held-out evaluation of the warm start: exact-match accuracy of
// the model's answers to arithmetic problems, decoded the way the rollout
// worker decodes (prompt [<|bos|>] + "a+b=", stop at <|eos|>).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/decoder_model.h"
#include "common/task/arith_task.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::trainer::sft {

struct GreedyCompletion {
  // Generated tokens, <|eos|> excluded.
  std::vector<int32_t> tokens;
  // The decoded text of `tokens`.
  std::string text;
  // Whether generation ended with <|eos|> (rather than the token limit).
  bool stopped = false;
};

// Greedy (argmax) completions of every problem's prompt, at most
// `max_new_tokens` tokens each (eos included), decoded in batches of
// `batch_size` sequences with KV caches (one prefill call for the batch,
// then one batched decode step per token). Runs under inference mode and
// never changes the model. LibTorch errors come back as InternalError.
absl::StatusOr<std::vector<GreedyCompletion>> GreedyComplete(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    absl::Span<const task::ArithProblem> problems, int64_t max_new_tokens,
    int64_t batch_size = 256);

// Whether `completion` is exactly the problem's answer followed by eos
// (what the `arith` verifier rewards).
bool IsExactMatch(const GreedyCompletion& completion,
                  const task::ArithProblem& problem);

// Tokens an answer of a `digits`-digit problem may need, eos included:
// digits + 1 (a carry or a '-') + 1.
int64_t MaxAnswerTokens(int digits);

struct EvalResult {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const {
    return total == 0 ? 0.0 : static_cast<double>(correct) / total;
  }
};

// Greedy exact-match accuracy over `problems`.
absl::StatusOr<EvalResult> EvaluateExactMatch(
    const model::DecoderModel& model, const tokenizer::Tokenizer& tokenizer,
    absl::Span<const task::ArithProblem> problems, int digits);

}  // namespace tandem::trainer::sft
