#pragma once

// Helpers for the coordinator's unit tests: an in-memory prompt source and
// sample builders.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/coordinator/prompt_source.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator::testing {

// `count` prompts "p0", "p1", ... with 4 prompt tokens each (0 = unbounded).
class CountingPromptSource : public PromptSource {
 public:
  explicit CountingPromptSource(uint64_t count) : count_(count) {}
  std::optional<Prompt> Next() override {
    if (count_ != 0 && cursor_ >= count_) return std::nullopt;
    Prompt prompt;
    prompt.id = absl::StrCat("p", cursor_++);
    prompt.text = prompt.id;
    prompt.token_ids = {1, 2, 3, 4};
    prompt.verifier = "arith";
    prompt.metadata["answer"] = "7";
    return prompt;
  }
  uint64_t cursor() const override { return cursor_; }
  std::string Describe() const override { return "counting"; }

 private:
  const uint64_t count_;
  uint64_t cursor_ = 0;
};

// A sample of `lease_id`/`group_id` with `tokens` completion tokens, all
// generated at `version`.
inline tandem::v1::Sample MakeSample(const std::string& lease_id,
                                     const std::string& group_id,
                                     uint32_t index, uint64_t version,
                                     int tokens = 2) {
  tandem::v1::Sample sample;
  sample.set_sample_id(absl::StrCat(lease_id, "/", index));
  sample.set_lease_id(lease_id);
  sample.set_group_id(group_id);
  sample.set_sample_index(index);
  for (int i = 0; i < tokens; ++i) {
    sample.add_completion_token_ids(7);
    sample.add_behavior_logprobs(-0.5f);
  }
  tandem::v1::VersionSpan* span = sample.add_version_spans();
  span->set_policy_version(version);
  span->set_num_tokens(tokens);
  sample.set_completion_text("7");
  return sample;
}

inline tandem::v1::Score MakeScore(double reward) {
  tandem::v1::Score score;
  score.set_reward(reward);
  score.set_outcome(reward > 0 ? "correct" : "incorrect");
  return score;
}

}  // namespace tandem::coordinator::testing
