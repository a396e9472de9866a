#include "services/trainer/tools/sft/sft_data.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/task/arith_tokenizer.h"

namespace tandem::trainer::sft {

std::vector<int32_t> PromptTokens(const tokenizer::Tokenizer& tokenizer,
                                  const task::ArithProblem& problem) {
  std::vector<int32_t> tokens = {task::kArithBosId};
  for (int32_t id : tokenizer.Encode(problem.prompt, /*parse_special=*/false)) {
    tokens.push_back(id);
  }
  return tokens;
}

SftExample MakeSftExample(const tokenizer::Tokenizer& tokenizer,
                          const task::ArithProblem& problem) {
  SftExample example;
  example.tokens = PromptTokens(tokenizer, problem);
  example.target_begin = static_cast<int64_t>(example.tokens.size());
  for (int32_t id : tokenizer.Encode(problem.answer, /*parse_special=*/false)) {
    example.tokens.push_back(id);
  }
  example.tokens.push_back(task::kArithEosId);
  return example;
}

SftExample MakeToolsSftExample(const task::ToolsDemonstration& demo) {
  SftExample example;
  example.tokens = demo.tokens;
  example.target_spans = demo.model_spans;
  example.target_begin =
      demo.model_spans.empty() ? 0 : demo.model_spans[0].first;
  return example;
}

absl::StatusOr<PackedBatch> PackExamples(
    absl::Span<const SftExample> examples) {
  if (examples.empty()) {
    return absl::InvalidArgumentError("PackExamples: no examples");
  }
  std::vector<int64_t> ids, positions, cu = {0}, loss_positions, targets;
  for (size_t b = 0; b < examples.size(); ++b) {
    const SftExample& e = examples[b];
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    std::vector<std::pair<int64_t, int64_t>> spans = e.target_spans;
    if (spans.empty()) {
      if (e.target_begin < 1 || e.target_begin >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("PackExamples: example ", b, " has target_begin ",
                         e.target_begin, " outside [1, ", n, ")"));
      }
      spans.emplace_back(e.target_begin, n);
    }
    int64_t previous_end = 1;
    for (const auto& [begin, end] : spans) {
      if (begin < previous_end || end <= begin || end > n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PackExamples: example ", b, " has target span [", begin, ", ", end,
            ") that is empty, out of order or outside [1, ", n, "]"));
      }
      previous_end = end;
    }
    const int64_t offset = cu.back();
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(e.tokens[i]);
      positions.push_back(i);
    }
    for (const auto& [begin, end] : spans) {
      for (int64_t i = begin; i < end; ++i) {
        loss_positions.push_back(offset + i - 1);
        targets.push_back(e.tokens[i]);
      }
    }
    cu.push_back(offset + n);
  }
  auto to_tensor = [](const std::vector<int64_t>& v) {
    return torch::tensor(at::ArrayRef<int64_t>(v), torch::kInt64);
  };
  PackedBatch batch;
  batch.input_ids = to_tensor(ids);
  batch.position_ids = to_tensor(positions);
  batch.cu_seqlens = to_tensor(cu);
  batch.loss_positions = to_tensor(loss_positions);
  batch.loss_targets = to_tensor(targets);
  return batch;
}

}  // namespace tandem::trainer::sft
