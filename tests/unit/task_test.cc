#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/task/arith_task.h"
#include "common/task/arith_tokenizer.h"
#include "common/task/tools_task.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::task {
namespace {

ArithTask MakeTask(ArithTaskOptions options = {}) {
  auto task = ArithTask::Create(options);
  REQUIRE(task.ok());
  return *task;
}

TEST_CASE("Arith problems are written as prompt a<op>b= and answer digits",
          "[task]") {
  ArithProblem sum = ArithTask::MakeProblem(123, '+', 456);
  CHECK(sum.prompt == "123+456=");
  CHECK(sum.answer == "579");
  ArithProblem diff = ArithTask::MakeProblem(12, '-', 345);
  CHECK(diff.prompt == "12-345=");
  CHECK(diff.answer == "-333");
  CHECK(ArithTask::MakeProblem(7, '-', 7).answer == "0");
  auto parsed = ParseArithPrompt("12-345=");
  REQUIRE(parsed.ok());
  CHECK(parsed->answer == "-333");
  CHECK_FALSE(ParseArithPrompt("12*3=").ok());
  CHECK_FALSE(ParseArithPrompt("12+3").ok());
  CHECK_FALSE(ParseArithPrompt("+3=").ok());
}

TEST_CASE("Arith streams are a pure function of seed, split and index",
          "[task]") {
  ArithTaskOptions options;
  options.seed = 42;
  ArithTask a = MakeTask(options);
  ArithTask b = MakeTask(options);
  for (uint64_t i = 0; i < 200; ++i) {
    CHECK(a.Sample(Split::kTrain, i).prompt ==
          b.Sample(Split::kTrain, i).prompt);
  }
  options.seed = 43;
  ArithTask c = MakeTask(options);
  int same = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    same +=
        a.Sample(Split::kTrain, i).prompt == c.Sample(Split::kTrain, i).prompt;
  }
  CHECK(same < 5);
}

TEST_CASE("Arith train and held-out splits are disjoint across seeds",
          "[task]") {
  std::set<std::string> heldout;
  std::set<std::string> train;
  for (uint64_t seed : {1, 2, 3}) {
    ArithTaskOptions options;
    options.seed = seed;
    options.digits = 2;  // a small space, so overlaps would show
    ArithTask task = MakeTask(options);
    for (const auto& p : task.Take(Split::kHeldOut, 300)) {
      CHECK(task.SplitOf(p) == Split::kHeldOut);
      heldout.insert(p.prompt);
    }
    for (const auto& p : task.Take(Split::kTrain, 2000)) {
      CHECK(task.SplitOf(p) == Split::kTrain);
      train.insert(p.prompt);
    }
  }
  for (const auto& prompt : heldout) CHECK(train.count(prompt) == 0);
  // About heldout_percent of the 2 * 100 * 100 problems are held out.
  ArithTask task = MakeTask(ArithTaskOptions{.digits = 2});
  int held = 0;
  for (int a = 0; a < 100; ++a) {
    for (int b = 0; b < 100; ++b) {
      held +=
          task.SplitOf(ArithTask::MakeProblem(a, '+', b)) == Split::kHeldOut;
    }
  }
  CHECK(held > 800);
  CHECK(held < 1200);
}

TEST_CASE("Arith operands have at most the configured digits and both ops",
          "[task]") {
  ArithTask task = MakeTask(ArithTaskOptions{.digits = 3, .seed = 5});
  int minus = 0;
  for (const auto& p : task.Take(Split::kTrain, 500)) {
    CHECK(p.a >= 0);
    CHECK(p.a < 1000);
    CHECK(p.b < 1000);
    minus += p.op == '-';
  }
  CHECK(minus > 150);
  CHECK(minus < 350);
  ArithTask plus_only =
      MakeTask(ArithTaskOptions{.digits = 3, .subtraction = false});
  for (const auto& p : plus_only.Take(Split::kTrain, 100)) CHECK(p.op == '+');
  CHECK_FALSE(ArithTask::Create(ArithTaskOptions{.digits = 0}).ok());
  CHECK_FALSE(ArithTask::Create(ArithTaskOptions{.heldout_percent = 0}).ok());
}

TEST_CASE("Arith tokenizer.json written to disk loads and round-trips",
          "[task]") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("tandem_arith_tokenizer_" + std::to_string(::getpid()) + ".json"))
          .string();
  REQUIRE(WriteArithTokenizer(path).ok());
  auto loaded = tokenizer::Tokenizer::FromFile(path);
  std::remove(path.c_str());
  REQUIRE(loaded.ok());
  const tokenizer::Tokenizer& tok = **loaded;
  CHECK(tok.vocab_size() == kArithVocabSize);
  CHECK(tok.TokenId(kArithBosToken) == kArithBosId);
  CHECK(tok.TokenId(kArithEosToken) == kArithEosId);
  CHECK(tok.TokenId(kArithPadToken) == kArithPadId);
  CHECK(tok.IsSpecial(kArithEosId));
  CHECK(tok.Encode("123+456=") ==
        std::vector<int32_t>{1, 2, 3, 10, 4, 5, 6, 12});
  CHECK(tok.Encode("-7 ") == std::vector<int32_t>{11, 7, 13});
  ArithTask task = MakeTask();
  for (const auto& p : task.Take(Split::kTrain, 200)) {
    const std::string text =
        std::string(kArithBosToken) + p.prompt + p.answer + kArithEosToken;
    std::vector<int32_t> ids = tok.Encode(text);
    CHECK(ids.size() == p.prompt.size() + p.answer.size() + 2);
    CHECK(tok.Decode(ids) == text);
    CHECK(tok.Decode(ids, /*skip_special=*/true) == p.prompt + p.answer);
  }
  auto in_memory = LoadArithTokenizer();
  REQUIRE(in_memory.ok());
  CHECK((*in_memory)->Encode("98-99=") == tok.Encode("98-99="));
}

}  // namespace
}  // namespace tandem::task

namespace tandem::task {
namespace {

// FNV-1a over every problem text, each closed by a 0xff byte.
struct TextDigest {
  uint64_t h = 1469598103934665603ULL;
  void Add(const std::string& text) {
    for (unsigned char c : text) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    h ^= 0xff;
    h *= 1099511628211ULL;
  }
};

// Datasets, held-out sets and the evaluation's problems are these streams:
// a change to them silently moves problems between train and held-out
// across releases. The pinned values were taken from the streams as they
// were before the shared split code (task_split.h) existed.
TEST_CASE("Arith and tools problem streams and splits are stable across "
          "releases",
          "[task][tools]") {
  TextDigest digest;
  std::vector<std::string> third;
  for (uint64_t seed : {0ULL, 7ULL}) {
    ArithTaskOptions arith_options;
    arith_options.seed = seed;
    absl::StatusOr<ArithTask> arith = ArithTask::Create(arith_options);
    REQUIRE(arith.ok());
    ToolsTaskOptions tools_options;
    tools_options.seed = seed;
    absl::StatusOr<ToolsTask> tools = ToolsTask::Create(tools_options);
    REQUIRE(tools.ok());
    for (Split split : {Split::kTrain, Split::kHeldOut}) {
      for (const ArithProblem& p : arith->Take(split, 500)) digest.Add(p.prompt);
      for (const ToolsProblem& p : tools->Take(split, 500)) {
        digest.Add(p.expression);
      }
      third.push_back(absl::StrCat(SplitName(split), " ",
                                   arith->Sample(split, 3).prompt, " ",
                                   tools->Sample(split, 3).expression));
    }
  }
  CHECK(third == std::vector<std::string>{"train 691+740= 2691*9740",
                                          "heldout 7-862= 1709*4367",
                                          "train 253-730= 8434*7783",
                                          "heldout 850+745= 8745*9404"});
  CHECK(digest.h == 0x4fa5a88e13443af5ULL);
}

}  // namespace
}  // namespace tandem::task
