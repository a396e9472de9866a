// tandemctl's model tools on a checkpoint written by our own writer: the
// ids of `tokenize` are the tokenizer's, and the log-probs that `generate`
// records through the KV-cache engine equal what `logprobs` computes with
// one packed forward over the same tokens; `export` writes back what it
// loaded.

#include "services/model_tools/model_tools.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/task/arith_tokenizer.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::model_tools {
namespace {

namespace fs = std::filesystem;

std::string WriteCheckpoint() {
  const fs::path dir = fs::temp_directory_path() /
                       ("tandemctl_model_" + std::to_string(getpid()));
  fs::create_directories(dir / "tok");
  REQUIRE(task::WriteArithTokenizer((dir / "tok" / "tokenizer.json").string())
              .ok());
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.vocab_size = 17;
  config.eos_token_ids = {15};
  auto weights = model::RandomInit(config, 3);
  REQUIRE(weights.ok());
  model::SaveOptions options;
  options.tokenizer_dir = (dir / "tok").string();
  REQUIRE(
      model::SaveHfModel(**weights, (dir / "model").string(), options).ok());
  return (dir / "model").string();
}

TEST_CASE("generate's engine log-probs equal logprobs' packed forward") {
  const std::string dir = WriteCheckpoint();
  std::ostringstream tokens_out;
  std::istringstream text("<|bos|>12+34=\n");
  REQUIRE(Tokenize(dir, text, tokens_out).ok());
  const auto prompt =
      nlohmann::json::parse(tokens_out.str()).get<std::vector<int32_t>>();
  CHECK(prompt == std::vector<int32_t>{14, 1, 2, 10, 3, 4, 12});

  GenerateOptions options;
  options.prompt = "<|bos|>12+34=";
  options.max_tokens = 6;
  std::ostringstream generated;
  REQUIRE(Generate(dir, options, generated).ok());
  const auto g = nlohmann::json::parse(generated.str());
  const auto output = g["tokens"].get<std::vector<int32_t>>();
  const auto engine_lp = g["logprobs"].get<std::vector<float>>();
  REQUIRE(!output.empty());

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  std::istringstream in(nlohmann::json{{"tokens", all}}.dump() + "\n");
  std::ostringstream out;
  REQUIRE(LogProbs(dir, in, out).ok());
  const auto packed =
      nlohmann::json::parse(out.str())["logprobs"].get<std::vector<float>>();
  REQUIRE(packed.size() == all.size() - 1);
  for (size_t t = 0; t < output.size(); ++t) {
    CHECK(engine_lp[t] == Approx(packed[prompt.size() - 1 + t]).margin(1e-4));
  }
  fs::remove_all(fs::path(dir).parent_path());
}

TEST_CASE("logprobs names the line and the bad token") {
  const std::string dir = WriteCheckpoint();
  std::istringstream in("{\"tokens\":[1,2]}\n{\"tokens\":[1,99]}\n");
  std::ostringstream out;
  absl::Status status = LogProbs(dir, in, out);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("input line 2: token 99 outside [0, 17)"));
  std::istringstream bad("not json\n");
  CHECK(LogProbs(dir, bad, out).code() == absl::StatusCode::kInvalidArgument);
  fs::remove_all(fs::path(dir).parent_path());
}

std::string LogProbsOf(const std::string& dir) {
  std::istringstream in("{\"tokens\":[14,1,2,10,3,4,12,5]}\n");
  std::ostringstream out;
  REQUIRE(LogProbs(dir, in, out).ok());
  return out.str();
}

TEST_CASE("export writes a directory that loads with the same weights") {
  const std::string dir = WriteCheckpoint();
  const std::string exported = (fs::path(dir).parent_path() / "out").string();
  REQUIRE(Export(dir, exported).ok());
  CHECK(fs::exists(fs::path(exported) / "tokenizer.json"));
  auto original = model::LoadHfModel(dir);
  auto loaded = model::LoadHfModel(exported);
  REQUIRE(original.ok());
  REQUIRE(loaded.ok());
  REQUIRE((*loaded)->tensors().size() == (*original)->tensors().size());
  for (const auto& [name, t] : (*original)->tensors()) {
    INFO(name);
    CHECK(at::equal(t, (*loaded)->tensors().at(name)));
  }
  CHECK(LogProbsOf(exported) == LogProbsOf(dir));
  fs::remove_all(fs::path(dir).parent_path());
}

TEST_CASE("export of the built-in model writes its tokenizer") {
  const fs::path out = fs::temp_directory_path() /
                       ("tandemctl_export_" + std::to_string(getpid()));
  REQUIRE(Export("", out.string()).ok());
  CHECK(fs::exists(out / "tokenizer.json"));
  CHECK(LogProbsOf(out.string()) == LogProbsOf(""));
  fs::remove_all(out);
}

}  // namespace
}  // namespace tandem::model_tools
