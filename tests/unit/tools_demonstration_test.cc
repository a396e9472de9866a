#include "common/task/tools_demonstration.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/chat/chat_template.h"
#include "common/chat/tool_calls.h"
#include "common/task/tools_tokenizer.h"
#include "tests/support/temp_dir.h"

namespace tandem::task {
namespace {

std::unique_ptr<tokenizer::Tokenizer> Tokenizer() {
  auto tokenizer = LoadToolsTokenizer();
  REQUIRE(tokenizer.ok());
  return std::move(*tokenizer);
}

chat::ChatTemplate Template() {
  auto tmpl = chat::ChatTemplate::Parse(ToolsChatTemplate(), "tools");
  REQUIRE(tmpl.ok());
  return *tmpl;
}

std::string Decode(const tokenizer::Tokenizer& tokenizer,
                   const std::vector<int32_t>& ids, int64_t begin,
                   int64_t end) {
  return tokenizer.Decode(
      std::vector<int32_t>(ids.begin() + begin, ids.begin() + end));
}

TEST_CASE(
    "The tools tokenizer writes every printable character and the "
    "chat tags as one token each, and decodes them back",
    "[task][tools]") {
  auto tokenizer = Tokenizer();
  CHECK(tokenizer->vocab_size() == kToolsVocabSize);
  std::string printable = "\n";
  for (int c = ' '; c <= '~'; ++c) printable += static_cast<char>(c);
  const std::vector<int32_t> ids = tokenizer->Encode(printable);
  REQUIRE(ids.size() == printable.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] == static_cast<int32_t>(i));
  }
  CHECK(tokenizer->Decode(ids) == printable);
  const std::string tags = "<|im_start|><|im_end|><tool_call></tool_call>";
  CHECK(tokenizer->Encode(tags) ==
        std::vector<int32_t>{kToolsImStartId, kToolsImEndId, kToolsCallOpenId,
                             kToolsCallCloseId});
  CHECK(tokenizer->Decode(tokenizer->Encode(tags)) == tags);
  CHECK(tokenizer->IsSpecial(kToolsImEndId));
  CHECK_FALSE(tokenizer->IsSpecial(kToolsCallOpenId));
}

TEST_CASE("The tools prompt is the user turn and the assistant header",
          "[task][tools]") {
  auto prompt = RenderToolsPrompt(Template(), ToolsTask::MakeProblem(48, 73));
  REQUIRE(prompt.ok());
  CHECK(*prompt ==
        "<|im_start|>user\n48*73<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE(
    "A tools demonstration is the whole episode, and only the call "
    "and the answer are the model's",
    "[task][tools]") {
  auto tokenizer = Tokenizer();
  const ToolsProblem p = ToolsTask::MakeProblem(4821, 7312);
  auto demo = MakeToolsDemonstration(*tokenizer, Template(), p);
  REQUIRE(demo.ok());
  const std::string prompt =
      "<|im_start|>user\n4821*7312<|im_end|>\n<|im_start|>assistant\n";
  const std::string call =
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": "
      "\"4821*7312\"}}</tool_call>";
  const std::string observation =
      "<|im_end|>\n<|im_start|>tool\n35251152<|im_end|>\n"
      "<|im_start|>assistant\n";
  const std::string answer = "35251152<|im_end|>";
  CHECK(tokenizer->Decode(demo->tokens) ==
        prompt + call + observation + answer);
  CHECK(Decode(*tokenizer, demo->tokens, 0, demo->prompt_tokens) == prompt);
  REQUIRE(demo->model_spans.size() == 2);
  const auto [call_begin, call_end] = demo->model_spans[0];
  const auto [answer_begin, answer_end] = demo->model_spans[1];
  CHECK(call_begin == demo->prompt_tokens);
  CHECK(Decode(*tokenizer, demo->tokens, call_begin, call_end) == call);
  CHECK(Decode(*tokenizer, demo->tokens, call_end, answer_begin) ==
        observation);
  CHECK(Decode(*tokenizer, demo->tokens, answer_begin, answer_end) == answer);
  CHECK(answer_end == static_cast<int64_t>(demo->tokens.size()));
  // The call turn is what the worker parses into the calculator's call, and
  // the answer turn is what the task scores correct.
  auto parsed = chat::ParseToolCalls(
      Decode(*tokenizer, demo->tokens, call_begin, call_end),
      chat::ToolCallFormat::kHermes);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->calls.size() == 1);
  CHECK(parsed->calls[0].name == "calculator");
  CHECK(parsed->calls[0].arguments_json == "{\"expression\":\"4821*7312\"}");
  CHECK(ScoreToolsAnswer(
      p, Decode(*tokenizer, demo->tokens, answer_begin, answer_end)));
  // Markup is single tokens: the call turn is its JSON's characters plus 2.
  CHECK(call_end - call_begin ==
        static_cast<int64_t>(call.size() - std::string("<tool_call>").size() -
                             std::string("</tool_call>").size() + 2));
}

TEST_CASE(
    "The written tokenizer directory carries the same template and "
    "the end of turn as eos",
    "[task][tools]") {
  testing::TempDir dir("tools_tokenizer");
  REQUIRE(WriteToolsTokenizerFiles(dir.path()).ok());
  auto loaded = chat::LoadChatTemplates(dir.path());
  REQUIRE(loaded.ok());
  auto tmpl = loaded->Get();
  REQUIRE(tmpl.ok());
  CHECK((*tmpl)->source() == ToolsChatTemplate());
  CHECK(loaded->special_tokens.at("eos_token") == "<|im_end|>");
  auto from_file =
      tokenizer::Tokenizer::FromFile(dir.path() + "/tokenizer.json");
  REQUIRE(from_file.ok());
  CHECK((*from_file)->vocab_size() == kToolsVocabSize);
}

TEST_CASE("A tools dataset row names the calculator and the exact answer",
          "[task][tools]") {
  const ToolsProblem p = ToolsTask::MakeProblem(48, 73);
  const auto row = nlohmann::json::parse(ToolsDatasetRow("P", p));
  CHECK(row["id"] == "tools-48*73");
  CHECK(row["prompt"] == "P");
  CHECK(row["verifier"] == "exact");
  CHECK(row["metadata"]["answer"] == "3504");
  CHECK(row["environment"] == "calculator");
}

}  // namespace
}  // namespace tandem::task
