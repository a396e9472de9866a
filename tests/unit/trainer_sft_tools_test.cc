// LibTorch before Catch2, so that CHECK is Catch2's.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/chat_template.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/task/tools_demonstration.h"
#include "common/task/tools_task.h"
#include "common/task/tools_tokenizer.h"
#include "services/trainer/tools/sft/sft_data.h"
#include "services/trainer/tools/sft/sft_trainer.h"
#include "services/trainer/tools/sft/tools_eval.h"

namespace tandem::trainer::sft {
namespace {

TEST_CASE("Packed tools demonstrations train only the model's turns",
          "[sft][tools]") {
  auto tokenizer = task::LoadToolsTokenizer();
  REQUIRE(tokenizer.ok());
  auto tmpl = chat::ChatTemplate::Parse(task::ToolsChatTemplate());
  REQUIRE(tmpl.ok());
  auto demo = task::MakeToolsDemonstration(
      **tokenizer, *tmpl, task::ToolsTask::MakeProblem(48, 73));
  REQUIRE(demo.ok());
  const SftExample e = MakeToolsSftExample(*demo);
  auto batch = PackExamples(std::vector<SftExample>{e, e});
  REQUIRE(batch.ok());
  const auto [call_begin, call_end] = demo->model_spans[0];
  const auto [answer_begin, answer_end] = demo->model_spans[1];
  const int64_t per_example =
      (call_end - call_begin) + (answer_end - answer_begin);
  REQUIRE(batch->loss_targets.size(0) == 2 * per_example);
  std::vector<int64_t> want_positions;
  for (int64_t offset : {int64_t{0}, static_cast<int64_t>(e.tokens.size())}) {
    for (const auto& [begin, end] : demo->model_spans) {
      for (int64_t i = begin; i < end; ++i)
        want_positions.push_back(offset + i - 1);
    }
  }
  for (size_t k = 0; k < want_positions.size(); ++k) {
    CHECK(batch->loss_positions[k].item<int64_t>() == want_positions[k]);
    const int64_t pos = want_positions[k] + 1;
    CHECK(batch->loss_targets[k].item<int64_t>() ==
          e.tokens[pos % e.tokens.size()]);
  }
  // The tool's result (environment tokens) is never a target: the first
  // answer target follows the observation's assistant header.
  CHECK(batch->loss_positions[call_end - call_begin].item<int64_t>() ==
        answer_begin - 1);

  SftExample bad = e;
  bad.target_spans = {{5, 3}};
  auto refused = PackExamples(std::vector<SftExample>{e, bad});
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()) ==
        absl::StrCat("PackExamples: example 1 has target span [5, 3) that is "
                     "empty, out of order or outside [1, ",
                     e.tokens.size(), "]"));
  bad.target_spans = {{0, 3}};
  CHECK_FALSE(PackExamples(std::vector<SftExample>{bad}).ok());
  bad.target_spans = {{10, 20}, {15, 30}};
  CHECK_FALSE(PackExamples(std::vector<SftExample>{bad}).ok());
}

TEST_CASE("A random tools model's episodes are evaluated, none correct",
          "[sft][tools]") {
  auto weights = model::RandomInit(ToolsTinyModelConfig(), /*seed=*/3);
  REQUIRE(weights.ok());
  const model::DecoderModel model(*weights);
  auto tokenizer = task::LoadToolsTokenizer();
  REQUIRE(tokenizer.ok());
  auto tmpl = chat::ChatTemplate::Parse(task::ToolsChatTemplate());
  REQUIRE(tmpl.ok());
  auto task = task::ToolsTask::Create({});
  REQUIRE(task.ok());
  const auto problems = task->Take(task::Split::kHeldOut, 8);
  auto eval = EvaluateToolsEpisodes(model, **tokenizer, *tmpl, problems,
                                    /*max_turn_tokens=*/16);
  REQUIRE(eval.ok());
  CHECK(eval->total == 8);
  CHECK(eval->correct == 0);
  CHECK(eval->accuracy() == 0.0);
  // Turns long enough that a tool's error message leaves no room for an
  // answer under the model's 256 positions end those episodes, wrong,
  // instead of failing the evaluation.
  auto long_turns = EvaluateToolsEpisodes(model, **tokenizer, *tmpl, problems,
                                          /*max_turn_tokens=*/220);
  REQUIRE(long_turns.ok());
  CHECK(long_turns->total == 8);
  CHECK(long_turns->correct == 0);
}

}  // namespace
}  // namespace tandem::trainer::sft
