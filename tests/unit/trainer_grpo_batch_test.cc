#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "services/trainer/rl/grpo_batch.h"

namespace tandem::trainer {
namespace {

ScoredCompletion Completion(std::vector<int32_t> tokens, double reward,
                            uint64_t version = 0) {
  ScoredCompletion c;
  c.behavior_logprobs.assign(tokens.size(), -1.0f);
  c.tokens = std::move(tokens);
  c.reward = reward;
  c.min_policy_version = version;
  return c;
}

ScoredPromptGroup Group(std::vector<ScoredCompletion> completions,
                        std::vector<int32_t> reference = {}) {
  ScoredPromptGroup g;
  g.prompt = {1, 2, 3};
  g.completions = std::move(completions);
  g.reference = std::move(reference);
  return g;
}

TEST_CASE(
    "A GRPO batch keeps every completion with trained tokens, with "
    "its group, reward and staleness",
    "[trainer][grpo]") {
  std::vector<ScoredPromptGroup> groups = {
      Group({Completion({4, 5}, 1.0, 3), Completion({6}, 0.0, 5)}),
      Group({Completion({}, 1.0), Completion({7, 8, 9}, 0.5, 6)})};
  groups[1].temperature = 0.5;
  absl::StatusOr<GrpoBatch> batch =
      SelectGrpoBatch(groups, GrpoBatchOptions{}, 6);
  REQUIRE(batch.ok());
  REQUIRE(batch->sequences.size() == 3);
  CHECK(batch->group_ids == std::vector<int64_t>{0, 0, 1});
  CHECK(batch->rewards == std::vector<float>{1.0f, 0.0f, 0.5f});
  CHECK(batch->staleness == std::vector<int64_t>{3, 1, 0});
  CHECK(batch->trained_tokens == 6);
  CHECK(batch->sequences[0].packed_tokens == 5);
  CHECK(batch->sequences[0].completion == &groups[0].completions[0]);
  CHECK(batch->sequences[2].inv_temperature == 2.0);
  CHECK(batch->reward_mean == Approx(0.5));
  CHECK(batch->reward_std == Approx(std::sqrt(1.25 / 3 - 0.25)));
  CHECK_FALSE(batch->nonfinite_reward);
}

TEST_CASE(
    "A group that failed uniformly gets its reference, and the "
    "batch's pointers stay valid when it moves",
    "[trainer][grpo]") {
  std::vector<ScoredPromptGroup> groups = {
      Group({Completion({4}, 0.0), Completion({5}, 0.0)}, {9, 10}),
      Group({Completion({6}, 1.0), Completion({7}, 0.0)}, {11})};
  GrpoBatchOptions options;
  options.reference_guidance = true;
  options.reference_reward = 1.0;
  absl::StatusOr<GrpoBatch> selected = SelectGrpoBatch(groups, options, 4);
  REQUIRE(selected.ok());
  GrpoBatch batch = std::move(selected).value();
  CHECK(batch.guided_groups == 1);
  CHECK(groups[0].completions.size() == 2);  // the input is not changed
  REQUIRE(batch.sequences.size() == 5);
  const ScoredCompletion& reference = *batch.sequences[2].completion;
  CHECK(reference.from_reference);
  CHECK(reference.tokens == std::vector<int32_t>{9, 10});
  CHECK(reference.min_policy_version == 4);
  CHECK(batch.sequences[2].prompt == &batch.guided[0].prompt);
  CHECK(batch.rewards[2] == 1.0f);
  // References are not what the rollouts scored.
  CHECK(batch.reward_mean == Approx(0.25));
}

TEST_CASE(
    "Uniform groups are dropped only while some group carries a "
    "signal",
    "[trainer][grpo]") {
  GrpoBatchOptions options;
  options.drop_uniform_groups = true;
  std::vector<ScoredPromptGroup> mixed = {
      Group({Completion({4}, 1.0), Completion({5}, 1.0)}),
      Group({Completion({6}, 1.0), Completion({7}, 0.0)})};
  absl::StatusOr<GrpoBatch> batch = SelectGrpoBatch(mixed, options, 0);
  REQUIRE(batch.ok());
  CHECK(batch->uniform_groups == 1);
  CHECK(batch->dropped_uniform_groups == 1);
  CHECK(batch->group_ids == std::vector<int64_t>{1, 1});
  // Dropped groups still count in what the rollouts scored.
  CHECK(batch->reward_mean == Approx(0.75));

  std::vector<ScoredPromptGroup> all_uniform = {
      Group({Completion({4}, 1.0), Completion({5}, 1.0)})};
  batch = SelectGrpoBatch(all_uniform, options, 0);
  REQUIRE(batch.ok());
  CHECK(batch->dropped_uniform_groups == 0);
  CHECK(batch->sequences.size() == 2);
}

TEST_CASE("A GRPO batch refuses bad completions, naming the group",
          "[trainer][grpo]") {
  std::vector<ScoredPromptGroup> groups = {Group({Completion({4}, 1.0)}),
                                           Group({Completion({5, 6}, 0.0)})};
  groups[1].completions[0].behavior_logprobs.pop_back();
  absl::StatusOr<GrpoBatch> batch =
      SelectGrpoBatch(groups, GrpoBatchOptions{}, 0);
  CHECK(batch.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(batch.status().message() ==
        "group 1: completion has 2 tokens but 1 behavior log-probs");

  groups[1].completions[0].behavior_logprobs.push_back(-1.0f);
  groups[1].completions[0].trained = {1};
  batch = SelectGrpoBatch(groups, GrpoBatchOptions{}, 0);
  CHECK(batch.status().message() ==
        "group 1: completion has 2 tokens but 1 trained flags");

  groups[1].completions[0].trained.clear();
  groups[0].temperature = -1.0;
  batch = SelectGrpoBatch(groups, GrpoBatchOptions{}, 0);
  CHECK(batch.status().message() ==
        "group 0: sampling temperature must be finite and >= 0, got -1");

  std::vector<ScoredPromptGroup> empty = {Group({Completion({}, 1.0)})};
  batch = SelectGrpoBatch(empty, GrpoBatchOptions{}, 0);
  CHECK(batch.status().message() == "batch has no completion tokens");
}

TEST_CASE("A non-finite reward marks the batch instead of its statistics",
          "[trainer][grpo]") {
  std::vector<ScoredPromptGroup> groups = {
      Group({Completion({4}, std::numeric_limits<double>::quiet_NaN()),
             Completion({5}, std::numeric_limits<double>::quiet_NaN())})};
  GrpoBatchOptions options;
  options.drop_uniform_groups = true;
  absl::StatusOr<GrpoBatch> batch = SelectGrpoBatch(groups, options, 0);
  REQUIRE(batch.ok());
  CHECK(batch->nonfinite_reward);
  // NaN is never "uniform": the group is not dropped out of sight.
  CHECK(batch->uniform_groups == 0);
  CHECK(batch->sequences.size() == 2);
  CHECK(batch->reward_mean == 0.0);
}

}  // namespace
}  // namespace tandem::trainer
