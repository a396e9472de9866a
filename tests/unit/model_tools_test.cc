// tandemctl's model tools on a checkpoint written by our own writer: the
// ids of `tokenize` are the tokenizer's, and the log-probs that `generate`
// records through the KV-cache engine equal what `logprobs` computes with
// one packed forward over the same tokens; `export` writes back what it
// loaded.

#include "services/model_tools/model_tools.h"
#include "services/model_tools/task_export.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/task/arith_task.h"
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
  // transformers needs the special tokens' roles (eos, pad) from here.
  std::ifstream config_file(out / "tokenizer_config.json");
  REQUIRE(config_file);
  const nlohmann::json config = nlohmann::json::parse(config_file);
  CHECK(config["tokenizer_class"] == "PreTrainedTokenizerFast");
  CHECK(config["bos_token"] == task::kArithBosToken);
  CHECK(config["eos_token"] == task::kArithEosToken);
  CHECK(config["pad_token"] == task::kArithPadToken);
  CHECK(LogProbsOf(out.string()) == LogProbsOf(""));
  fs::remove_all(out);
}

// The lines of `tandem-model task` with these options, parsed.
std::vector<nlohmann::json> TaskLines(const TaskExportOptions& options) {
  std::ostringstream out;
  REQUIRE(ExportTask(options, out).ok());
  std::vector<nlohmann::json> lines;
  std::istringstream in(out.str());
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST_CASE("task exports the problems the trainer evaluates and trains on") {
  task::ArithTaskOptions task_options;
  task_options.digits = 3;
  task_options.subtraction = false;
  task_options.seed = 7;
  auto task = task::ArithTask::Create(task_options);
  REQUIRE(task.ok());
  for (task::Split split : {task::Split::kHeldOut, task::Split::kTrain}) {
    TaskExportOptions options;
    options.split = split == task::Split::kTrain ? "train" : "heldout";
    options.count = 300;
    options.seed = 7;
    const std::vector<nlohmann::json> lines = TaskLines(options);
    // The held-out evaluator scores Take(kHeldOut, eval.problems); the
    // coordinator hands out Sample(kTrain, 0), Sample(kTrain, 1), ...
    const std::vector<task::ArithProblem> want = task->Take(split, 300);
    REQUIRE(lines.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(options.split << " line " << i);
      CHECK(lines[i]["prompt"] == want[i].prompt);
      CHECK(lines[i]["answer"] == want[i].answer);
      CHECK(lines[i]["id"] == want[i].id);
      CHECK(task->SplitOf(want[i]) == split);
    }
  }
}

TEST_CASE("task names a bad split") {
  TaskExportOptions options;
  options.split = "test";
  std::ostringstream out;
  const absl::Status status = ExportTask(options, out);
  CHECK(absl::IsInvalidArgument(status));
  CHECK(std::string(status.message()).find("'test'") != std::string::npos);
}

}  // namespace
}  // namespace tandem::model_tools
