#include "engine/generate_all.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::engine {

absl::StatusOr<std::vector<FinishedSample>> GenerateAll(
    EngineModel* model, absl::Span<const std::vector<int32_t>> prompts,
    const GenerateAllOptions& options) {
  if (!options.seeds.empty() && options.seeds.size() != prompts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.seeds.size(), " seeds for ", prompts.size(),
                     " prompts: give one per prompt, or none"));
  }
  Engine engine(options.engine, model, /*weights=*/nullptr,
                /*initial_version=*/0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params = options.params;
    if (!options.seeds.empty()) params.seed = options.seeds[i];
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
  // Request ids are the prompts' indexes, which we wrote: prompt i's
  // sample j goes to slot i * n + j.
  const size_t n = static_cast<size_t>(std::max(1, options.params.n));
  std::vector<std::optional<FinishedSample>> slots(prompts.size() * n);
  auto place = [&](std::vector<FinishedSample> finished) -> absl::Status {
    for (FinishedSample& sample : finished) {
      size_t index = 0;
      if (!absl::SimpleAtoi(sample.request_id, &index) ||
          index >= prompts.size() || sample.sample_index < 0 ||
          static_cast<size_t>(sample.sample_index) >= n) {
        return absl::InternalError(absl::StrCat(
            "the engine finished an unknown request '", sample.request_id,
            "' (sample ", sample.sample_index, ")"));
      }
      slots[index * n + static_cast<size_t>(sample.sample_index)] =
          std::move(sample);
    }
    return absl::OkStatus();
  };
  while (!engine.idle()) {
    RETURN_IF_ERROR(engine.Step().status());
    RETURN_IF_ERROR(place(engine.TakeFinished()));
  }
  RETURN_IF_ERROR(place(engine.TakeFinished()));
  std::vector<FinishedSample> out;
  out.reserve(slots.size());
  for (std::optional<FinishedSample>& slot : slots) {
    if (slot.has_value()) out.push_back(std::move(*slot));
  }
  return out;
}

}  // namespace tandem::engine
