// PrepareRequest (services/rollout/openai_prompt.h): what an OpenAI request
// asks the engine for, and the refusals that never reach the engine, on the
// built-in arithmetic tokenizer (no chat template).
#include <catch2/catch.hpp>
#include <string>
#include <variant>

#include "common/task/arith_tokenizer.h"
#include "services/rollout/openai_prompt.h"

namespace tandem::rollout {
namespace {

constexpr char kNoChat[] = "this model has no chat template";

struct Fixture {
  Fixture() {
    auto loaded = task::LoadArithTokenizer();
    REQUIRE(loaded.ok());
    tokenizer = std::move(*loaded);
  }
  std::variant<PreparedRequest, openai::ApiError> Prepare(
      const openai::CompletionRequest& request) const {
    return PrepareRequest(request, *tokenizer, /*templates=*/nullptr, kNoChat,
                          limits);
  }
  openai::ApiError Refused(const openai::CompletionRequest& request) const {
    auto result = Prepare(request);
    REQUIRE(std::holds_alternative<openai::ApiError>(result));
    return std::get<openai::ApiError>(result);
  }
  PreparedRequest Accepted(const openai::CompletionRequest& request) const {
    auto result = Prepare(request);
    if (const auto* error = std::get_if<openai::ApiError>(&result)) {
      FAIL(error->message);
    }
    return std::get<PreparedRequest>(result);
  }
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  PromptLimits limits{.context_tokens = 32, .vocab_size = 20,
                      .default_max_tokens = 16};
};

openai::CompletionRequest Text(std::string prompt) {
  openai::CompletionRequest r;
  r.prompt_text = std::move(prompt);
  return r;
}

openai::CompletionRequest Ids(std::vector<int32_t> ids) {
  openai::CompletionRequest r;
  r.prompt_is_ids = true;
  r.prompt_ids = std::move(ids);
  return r;
}

TEST_CASE_METHOD(Fixture, "a text prompt is encoded; sampling is the request's") {
  openai::CompletionRequest r = Text("12+3=");
  r.temperature = 0.5;
  r.top_p = 0.9;
  r.n = 3;
  r.seed = 7;
  const PreparedRequest p = Accepted(r);
  CHECK(p.prompt == tokenizer->Encode("12+3=", /*parse_special=*/true));
  CHECK(p.prompt.size() == 5);
  CHECK(p.params.temperature == Approx(0.5));
  CHECK(p.params.top_p == Approx(0.9));
  CHECK(p.params.n == 3);
  CHECK(p.params.seed == 7);
  CHECK(p.params.report_tokens);
  // Completions default to default_max_tokens, capped by the context left.
  CHECK(p.params.max_tokens == 16);
  CHECK(Accepted(Text("1234567890123456789012345+")).params.max_tokens == 6);
}

TEST_CASE_METHOD(Fixture, "seed 0 is a fixed seed, not the engine's draw-one") {
  openai::CompletionRequest r = Text("1+1=");
  r.seed = 0;
  CHECK(Accepted(r).params.seed != 0);
  CHECK(Accepted(Text("1+1=")).params.seed == 0);
}

TEST_CASE_METHOD(Fixture, "token ids are checked against the vocabulary") {
  CHECK(Accepted(Ids({1, 2, 19})).prompt == std::vector<int32_t>{1, 2, 19});
  const openai::ApiError e = Refused(Ids({1, 20, 2}));
  CHECK(e.param == "prompt");
  CHECK_THAT(e.message, Catch::Contains("prompt[1] = 20") &&
                            Catch::Contains("vocabulary of 20"));
}

TEST_CASE_METHOD(Fixture, "the context bounds the prompt and max_tokens") {
  CHECK(Refused(Text("")).message == "the prompt encodes to no tokens");
  const openai::ApiError full = Refused(Ids(std::vector<int32_t>(32, 1)));
  CHECK(full.code == "context_length_exceeded");
  CHECK_THAT(full.message, Catch::Contains("the prompt is 32 tokens"));
  openai::CompletionRequest r = Ids(std::vector<int32_t>(30, 1));
  r.max_tokens = 2;
  CHECK(Accepted(r).params.max_tokens == 2);
  r.max_tokens = 3;
  const openai::ApiError over = Refused(r);
  CHECK(over.param == "max_tokens");
  CHECK(over.code == "context_length_exceeded");
  CHECK_THAT(over.message, Catch::Contains("max_tokens (3)"));
}

TEST_CASE_METHOD(Fixture, "chat without a template is refused with the reason") {
  openai::CompletionRequest r;
  r.endpoint = openai::Endpoint::kChatCompletions;
  const openai::ApiError e = Refused(r);
  CHECK(e.http_status == 400);
  CHECK(e.message == kNoChat);
  CHECK(e.param == "messages");
}

}  // namespace
}  // namespace tandem::rollout
