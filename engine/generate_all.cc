#include "engine/generate_all.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::engine {

absl::StatusOr<std::vector<FinishedSample>> GenerateAll(
    EngineModel* model, absl::Span<const std::vector<int32_t>> prompts,
    const GenerateAllOptions& options) {
  Engine engine(options.engine, model, /*weights=*/nullptr,
                /*initial_version=*/0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params = options.params;
    if (options.max_sequence_tokens > 0) {
      const int64_t room =
          options.max_sequence_tokens - static_cast<int64_t>(prompts[i].size());
      if (room < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prompt ", i, " has ", prompts[i].size(),
            " tokens, which leaves no room under the sequence limit of ",
            options.max_sequence_tokens));
      }
      params.max_tokens =
          static_cast<int32_t>(std::min<int64_t>(params.max_tokens, room));
    }
    RETURN_IF_ERROR(engine.Add(std::to_string(i), prompts[i], params));
  }
  std::vector<FinishedSample> out;
  out.reserve(prompts.size() * static_cast<size_t>(options.params.n));
  while (!engine.idle()) {
    RETURN_IF_ERROR(engine.Step().status());
    for (FinishedSample& sample : engine.TakeFinished()) {
      out.push_back(std::move(sample));
    }
  }
  for (FinishedSample& sample : engine.TakeFinished()) {
    out.push_back(std::move(sample));
  }
  // Request ids are the prompts' indexes, which we wrote.
  std::vector<std::pair<std::pair<size_t, int32_t>, size_t>> order;
  order.reserve(out.size());
  for (size_t k = 0; k < out.size(); ++k) {
    size_t index = 0;
    if (!absl::SimpleAtoi(out[k].request_id, &index)) {
      return absl::InternalError(absl::StrCat(
          "the engine finished an unknown request '", out[k].request_id, "'"));
    }
    order.push_back({{index, out[k].sample_index}, k});
  }
  std::sort(order.begin(), order.end());
  std::vector<FinishedSample> sorted;
  sorted.reserve(out.size());
  for (const auto& entry : order) {
    sorted.push_back(std::move(out[entry.second]));
  }
  return sorted;
}

}  // namespace tandem::engine
