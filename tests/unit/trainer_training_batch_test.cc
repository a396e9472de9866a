// A pulled training batch becomes the GrpoTrainer's groups, except groups
// with a token id outside the policy's vocabulary (which would index past
// the embedding table): those are left out with a reason naming the group,
// the field, the position, the value and the vocabulary size, and the rest
// of the batch is kept.

#include <string>

#include "services/trainer/training_batch.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

constexpr int32_t kVocab = 100;

tandem::v1::ScoredGroup Group(const std::string& id) {
  tandem::v1::ScoredGroup group;
  group.set_group_id(id);
  for (int32_t t : {1, 2, 3}) group.add_prompt_token_ids(t);
  for (int i = 0; i < 2; ++i) {
    tandem::v1::ScoredSample* scored = group.add_samples();
    tandem::v1::Sample* sample = scored->mutable_sample();
    for (int32_t t : {5, kVocab - 1}) {
      sample->add_completion_token_ids(t);
      sample->add_behavior_logprobs(-0.5f);
    }
    scored->mutable_score()->set_reward(i);
  }
  return group;
}

TEST_CASE(
    "groups_with_a_token_id_outside_the_vocabulary_are_left_out_with_a_"
    "reason") {
  tandem::v1::PullTrainingBatchResponse batch;
  batch.set_batch_id("b1");
  *batch.add_groups() = Group("good");
  tandem::v1::ScoredGroup past_end = Group("past-end");
  past_end.mutable_samples(1)->mutable_sample()->set_completion_token_ids(
      1, kVocab);
  *batch.add_groups() = past_end;
  tandem::v1::ScoredGroup negative = Group("negative");
  negative.set_prompt_token_ids(2, -7);
  *batch.add_groups() = negative;
  tandem::v1::ScoredGroup huge = Group("huge");
  huge.mutable_samples(0)->mutable_sample()->set_completion_token_ids(
      0, 2147483647);
  *batch.add_groups() = huge;
  *batch.add_groups() = Group("good2");

  const ConvertedBatch converted = ConvertTrainingBatch(batch, kVocab);
  CHECK(converted.group_ids == std::vector<std::string>{"good", "good2"});
  REQUIRE(converted.groups.size() == 2);
  CHECK(converted.groups[0].prompt == std::vector<int32_t>{1, 2, 3});
  REQUIRE(converted.groups[0].completions.size() == 2);
  CHECK(converted.groups[0].completions[1].tokens ==
        std::vector<int32_t>{5, kVocab - 1});
  CHECK(converted.groups[0].completions[1].reward == 1.0);
  CHECK(converted.refused ==
        std::vector<std::string>{
            "group past-end: samples[1].completion_token_ids[1] is 100, "
            "outside the policy's vocabulary [0, 100)",
            "group negative: prompt_token_ids[2] is -7, outside the "
            "policy's vocabulary [0, 100)",
            "group huge: samples[0].completion_token_ids[0] is 2147483647, "
            "outside the policy's vocabulary [0, 100)"});
}

TEST_CASE("an_episode's_environment_tokens_are_marked_not_trained") {
  tandem::v1::PullTrainingBatchResponse batch;
  tandem::v1::ScoredGroup episode = Group("episode");
  // Sample 1: the model's token, then the environment's.
  tandem::v1::Sample* sample = episode.mutable_samples(1)->mutable_sample();
  for (auto source : {tandem::v1::TOKEN_SOURCE_MODEL,
                      tandem::v1::TOKEN_SOURCE_ENVIRONMENT}) {
    tandem::v1::SourceSpan* span = sample->add_source_spans();
    span->set_source(source);
    span->set_num_tokens(1);
  }
  *batch.add_groups() = episode;
  const ConvertedBatch converted = ConvertTrainingBatch(batch, kVocab);
  REQUIRE(converted.groups.size() == 1);
  const auto& completions = converted.groups[0].completions;
  REQUIRE(completions.size() == 2);
  CHECK(completions[0].trained.empty());  // single turn: all the model's
  CHECK(completions[0].trained_tokens() == 2);
  CHECK(completions[1].trained == std::vector<uint8_t>{1, 0});
  CHECK(completions[1].trained_tokens() == 1);
}

}  // namespace
}  // namespace tandem::trainer
