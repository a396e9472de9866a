#include <catch2/catch.hpp>
#include <set>

#include "common/task/arith_task.h"
#include "common/task/arith_tokenizer.h"
#include "services/coordinator/group_state.h"
#include "services/coordinator/jsonl_dataset.h"
#include "services/coordinator/prompt_source.h"

namespace tandem::coordinator {
namespace {

std::unique_ptr<tokenizer::Tokenizer> ArithTokenizer() {
  auto tokenizer = task::LoadArithTokenizer();
  REQUIRE(tokenizer.ok());
  return std::move(tokenizer).value();
}

TEST_CASE("JSONL: prompt text is tokenized, token ids are taken as given",
          "[coordinator][dataset]") {
  auto tokenizer = ArithTokenizer();
  const std::string text =
      R"({"id": "a", "prompt": "1+2=", "verifier": "arith", "metadata": {"answer": "3"}})"
      "\n\n"
      R"({"prompt_token_ids": [1, 10, 2, 12], "verifier": "exact", "extra": 5})"
      "\r\n"
      R"({"prompt": "1+2=", "verifier": "exact", "environment": "calculator", "reward_range": [-1, 0.5]})"
      "\n"
      R"({"prompt": "1+2=", "verifier": "arith", "reference_completion": "3"})"
      "\n"
      R"({"prompt": "1+2=", "verifier": "arith", "reference_completion_ids": [3, 15]})";
  auto dataset = ParseJsonlDataset(text, "d.jsonl", tokenizer.get(), false);
  REQUIRE(dataset.ok());
  REQUIRE(dataset->prompts.size() == 5);
  const Prompt& a = dataset->prompts[0];
  CHECK(a.id == "a");
  CHECK(a.token_ids == std::vector<int32_t>{1, 10, 2, 12});
  CHECK(a.verifier == "arith");
  CHECK(a.metadata.at("answer") == "3");
  const Prompt& b = dataset->prompts[1];
  CHECK(b.id == "d.jsonl:3");
  CHECK(b.text == "1+2=");
  CHECK(b.verifier == "exact");
  CHECK(a.environment.empty());  // single-turn
  CHECK(dataset->prompts[2].environment == "calculator");
  CHECK(dataset->prompts[2].reward_range.min == -1.0);
  CHECK(dataset->prompts[2].reward_range.max == 0.5);
  CHECK(a.reward_range.min == 0.0);  // the default [0, 1]
  CHECK(a.reward_range.max == 1.0);
  // Reference completions (training.guide_failed_groups): none by default,
  // text tokenized, ids taken as given.
  CHECK(a.reference_completion_ids.empty());
  CHECK(dataset->prompts[3].reference_completion_ids ==
        tokenizer->Encode("3"));
  CHECK(dataset->prompts[4].reference_completion_ids ==
        std::vector<int32_t>{3, 15});
}

TEST_CASE("JSONL: malformed lines are reported with file and line",
          "[coordinator][dataset]") {
  auto tokenizer = ArithTokenizer();
  struct Case {
    std::string line;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"prompt": "1+1="})", "verifier must be a non-empty string"},
      {R"({"verifier": "arith"})", "needs prompt or prompt_token_ids"},
      {R"({"prompt": 5, "verifier": "arith"})", "prompt must be a string"},
      {R"({"prompt": "1=", "verifier": "arith", "environment": 3})",
       "environment must be a string"},
      {R"({"prompt": "1=", "verifier": "arith", "reward_range": [0, 2]})",
       "reward_range needs an environment"},
      {R"({"prompt": "1=", "verifier": "arith", "environment": "e", "reward_range": [0]})",
       "reward_range must be [min, max], two numbers; got [0]"},
      {R"({"prompt": "1=", "verifier": "arith", "environment": "e", "reward_range": [1, 1]})",
       "reward_range [1, 1] must have min < max"},
      {R"({"prompt": "1=", "verifier": "arith", "environment": "e", "reward_range": [0, 1e9]})",
       "must lie within [-1000000, 1000000]"},
      {R"({"prompt": "1=", "verifier": "arith", "metadata": {"answer": 2}})",
       "metadata.answer must be a string"},
      {R"({"prompt_token_ids": [1, -2], "verifier": "arith"})",
       "prompt_token_ids[1] must be a non-negative"},
      {R"({"prompt_token_ids": [99], "verifier": "arith"})",
       "outside the tokenizer's vocabulary"},
      {R"({"id": "x", "prompt": "1=", "verifier": "arith"})",
       "duplicate id \"x\""},
      {R"({"prompt": "1=", "verifier": "arith", "reference_completion": 3})",
       "reference_completion must be a string"},
      {R"({"prompt": "1=", "verifier": "arith", "reference_completion_ids": []})",
       "reference_completion_ids must be a non-empty array"},
      {R"({"prompt": "1=", "verifier": "arith", "reference_completion_ids": [1, 99]})",
       "reference_completion_ids[1] must be a token id of the vocabulary, got 99"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.line);
    const std::string text =
        std::string(R"({"id": "x", "prompt": "2=", "verifier": "arith"})") +
        "\n" + c.line + "\n";
    auto refused = ParseJsonlDataset(text, "d.jsonl", tokenizer.get(), false);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()),
               Catch::StartsWith("d.jsonl:2: ") && Catch::Contains(c.message));
    auto skipped = ParseJsonlDataset(text, "d.jsonl", tokenizer.get(), true);
    REQUIRE(skipped.ok());
    CHECK(skipped->prompts.size() == 1);
    REQUIRE(skipped->skipped.size() == 1);
    CHECK_THAT(skipped->skipped[0], Catch::StartsWith("d.jsonl:2: "));
  }
  auto no_tokenizer = ParseJsonlDataset(
      R"({"prompt": "1=", "verifier": "arith"})", "d.jsonl", nullptr, false);
  REQUIRE_FALSE(no_tokenizer.ok());
  CHECK_THAT(std::string(no_tokenizer.status().message()),
             Catch::Contains("dataset.tokenizer"));
  auto nothing = ParseJsonlDataset("{\n", "d.jsonl", nullptr, true);
  CHECK_FALSE(nothing.ok());
}

JsonlDataset Numbered(int n) {
  JsonlDataset dataset;
  for (int i = 0; i < n; ++i) {
    Prompt prompt;
    prompt.id = std::to_string(i);
    prompt.token_ids = {i};
    prompt.verifier = "exact";
    dataset.prompts.push_back(prompt);
  }
  return dataset;
}

std::vector<std::string> Drain(PromptSource& source, int limit) {
  std::vector<std::string> ids;
  while (static_cast<int>(ids.size()) < limit) {
    auto prompt = source.Next();
    if (!prompt) break;
    ids.push_back(prompt->id);
  }
  return ids;
}

TEST_CASE("JSONL: epochs are seeded shuffles and end when configured",
          "[coordinator][dataset]") {
  DatasetOptions options;
  options.seed = 7;
  options.epochs = 2;
  auto source = NewJsonlPromptSource(Numbered(20), options, "test");
  std::vector<std::string> ids = Drain(*source, 100);
  REQUIRE(ids.size() == 40);
  CHECK(source->cursor() == 40);
  CHECK_FALSE(source->Next().has_value());
  std::vector<std::string> first(ids.begin(), ids.begin() + 20);
  std::vector<std::string> second(ids.begin() + 20, ids.end());
  CHECK(std::set<std::string>(first.begin(), first.end()).size() == 20);
  for (const auto& id : second) CHECK_THAT(id, Catch::EndsWith("@1"));
  std::vector<std::string> second_bare;
  for (const auto& id : second)
    second_bare.push_back(id.substr(0, id.find('@')));
  CHECK(second_bare != first);  // a different shuffle each epoch
  std::vector<std::string> in_order;
  for (int i = 0; i < 20; ++i) in_order.push_back(std::to_string(i));
  CHECK(first != in_order);
  // Same seed, same order; no shuffle, file order.
  auto again = NewJsonlPromptSource(Numbered(20), options, "test");
  CHECK(Drain(*again, 100) == ids);
  options.shuffle = false;
  options.epochs = 0;
  auto plain = NewJsonlPromptSource(Numbered(20), options, "test");
  std::vector<std::string> plain_ids = Drain(*plain, 45);
  CHECK(std::vector<std::string>(plain_ids.begin(), plain_ids.begin() + 20) ==
        in_order);
  CHECK(plain_ids.size() == 45);  // unbounded
}

TEST_CASE(
    "Built-in arith source leases tokenized train problems for the "
    "arith verifier",
    "[coordinator][dataset]") {
  DatasetOptions options;
  options.seed = 3;
  auto source = NewArithPromptSource(options);
  REQUIRE(source.ok());
  auto tokenizer = ArithTokenizer();
  auto task = task::ArithTask::Create({.digits = 3, .seed = 3});
  REQUIRE(task.ok());
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    auto prompt = (*source)->Next();
    REQUIRE(prompt.has_value());
    CHECK(prompt->verifier == "arith");
    CHECK(prompt->token_ids.front() == task::kArithBosId);
    std::vector<int32_t> rest(prompt->token_ids.begin() + 1,
                              prompt->token_ids.end());
    CHECK(tokenizer->Decode(rest) == prompt->text);
    auto parsed = task::ParseArithPrompt(prompt->text);
    REQUIRE(parsed.ok());
    CHECK(prompt->metadata.at("answer") == parsed->answer);
    // The reference completion: the answer and the end token.
    std::vector<int32_t> reference = tokenizer->Encode(parsed->answer);
    reference.push_back(task::kArithEosId);
    CHECK(prompt->reference_completion_ids == reference);
    CHECK(task->SplitOf(*parsed) == task::Split::kTrain);
    ids.insert(prompt->id);
  }
  CHECK(ids.size() == 50);
  CHECK((*source)->stop_token_ids() == std::vector<int32_t>{task::kArithEosId});
  CHECK((*source)->default_max_tokens() == 6);
}

TEST_CASE("A prompt's reference completion reaches the trainer and survives "
          "the journal",
          "[coordinator][dataset]") {
  auto prompt = std::make_shared<Prompt>();
  prompt->id = "p";
  prompt->token_ids = {1, 2};
  prompt->verifier = "arith";
  prompt->reference_completion_ids = {3, 15};
  GroupState group;
  group.group_id = "g";
  group.prompt = prompt;
  group.samples.resize(2);
  group.scores.resize(2);
  const tandem::v1::ScoredGroup scored = ToScoredGroup(group);
  CHECK(std::vector<int32_t>(scored.reference_completion_ids().begin(),
                             scored.reference_completion_ids().end()) ==
        std::vector<int32_t>{3, 15});
  std::unique_ptr<GroupState> replayed = FromJournal(ToJournal(group), 2);
  CHECK(replayed->prompt->reference_completion_ids ==
        std::vector<int32_t>{3, 15});
}

}  // namespace
}  // namespace tandem::coordinator
