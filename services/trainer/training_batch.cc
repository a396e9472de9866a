#include "services/trainer/training_batch.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace tandem::trainer {
namespace {

// The first id of `ids` outside [0, vocab_size), described; nullopt when
// all are inside.
template <typename Ids>
std::optional<std::string> OutOfRange(const Ids& ids, const std::string& field,
                                      int64_t vocab_size) {
  for (int k = 0; k < ids.size(); ++k) {
    const int64_t id = ids.Get(k);
    if (id < 0 || id >= vocab_size) {
      return absl::StrCat(field, "[", k, "] is ", id,
                          ", outside the policy's vocabulary [0, ", vocab_size,
                          ")");
    }
  }
  return std::nullopt;
}

}  // namespace

ConvertedBatch ConvertTrainingBatch(
    const tandem::v1::PullTrainingBatchResponse& batch, int64_t vocab_size) {
  ConvertedBatch out;
  for (const auto& g : batch.groups()) {
    std::optional<std::string> bad =
        OutOfRange(g.prompt_token_ids(), "prompt_token_ids", vocab_size);
    for (int i = 0; !bad && i < g.samples_size(); ++i) {
      bad = OutOfRange(g.samples(i).sample().completion_token_ids(),
                       absl::StrCat("samples[", i, "].completion_token_ids"),
                       vocab_size);
    }
    if (!bad) {
      bad = OutOfRange(g.reference_completion_ids(),
                       "reference_completion_ids", vocab_size);
    }
    if (bad) {
      out.refused.push_back(absl::StrCat("group ", g.group_id(), ": ", *bad));
      continue;
    }
    ScoredPromptGroup group;
    group.prompt.assign(g.prompt_token_ids().begin(),
                        g.prompt_token_ids().end());
    // Log-probs at the temperature the samples were drawn with (0, greedy
    // or unset by an older coordinator, counts as 1).
    group.temperature = g.sampling().temperature();
    group.reference.assign(g.reference_completion_ids().begin(),
                           g.reference_completion_ids().end());
    for (const auto& scored : g.samples()) {
      const auto& s = scored.sample();
      ScoredCompletion c;
      c.tokens.assign(s.completion_token_ids().begin(),
                      s.completion_token_ids().end());
      c.behavior_logprobs.assign(s.behavior_logprobs().begin(),
                                 s.behavior_logprobs().end());
      c.reward = scored.score().reward();
      c.min_policy_version = g.min_policy_version();
      for (const auto& span : s.version_spans()) {
        c.min_policy_version =
            std::min(c.min_policy_version, span.policy_version());
      }
      // Multi-turn: the environment's tokens are context, not loss terms
      // (the coordinator checked that the spans cover every token).
      if (s.source_spans_size() > 0) {
        c.trained.reserve(c.tokens.size());
        for (const auto& span : s.source_spans()) {
          c.trained.insert(
              c.trained.end(), span.num_tokens(),
              span.source() == tandem::v1::TOKEN_SOURCE_MODEL ? 1 : 0);
        }
        c.trained.resize(c.tokens.size(), 0);
      }
      group.completions.push_back(std::move(c));
    }
    out.groups.push_back(std::move(group));
    out.group_ids.push_back(g.group_id());
  }
  return out;
}

}  // namespace tandem::trainer
