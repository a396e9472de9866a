// BestPolicyKeeper: the most accurate held-out evaluation's policy is kept
// at <checkpoint_dir>/best as a Hugging Face directory; a worse one leaves
// it in place, a better one replaces it (the old directory removed), and a
// new keeper over the same directory (a restarted trainer) remembers it.

#include "services/trainer/best_policy.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;

HeldoutResult Result(uint64_t version, int64_t correct) {
  HeldoutResult r;
  r.policy_version = version;
  r.correct = correct;
  r.total = 2048;
  return r;
}

TEST_CASE("the best held-out policy is kept and replaced only by a better "
          "one") {
  model::testing::TempDir dir;
  auto weights = model::RandomInit(model::testing::TinyQwen2Config(), 4);
  REQUIRE(weights.ok());
  BestPolicyOptions options;
  options.checkpoint_dir = dir.path();
  options.builtin_tokenizer = true;
  BestPolicyKeeper keeper(options);
  CHECK_FALSE(keeper.best().has_value());

  auto first = keeper.Offer(**weights, Result(20, 1024), 20);
  REQUIRE(first.ok());
  REQUIRE(first->has_value());
  const fs::path link = fs::path(dir.path()) / kBestPolicyLink;
  CHECK(fs::is_symlink(link));
  CHECK(fs::read_symlink(link) == "best-v20");
  CHECK(fs::exists(link / "model.safetensors"));
  CHECK(fs::exists(link / "tokenizer.json"));
  CHECK(model::LoadHfModel((link).string()).ok());
  {
    std::ifstream in(link / kBestPolicyInfoFile);
    const auto j = nlohmann::json::parse(in);
    CHECK(j["policy_version"] == 20);
    CHECK(j["accuracy"] == 0.5);
    CHECK(j["problems"] == 2048);
  }

  auto worse = keeper.Offer(**weights, Result(40, 1000), 40);
  REQUIRE(worse.ok());
  CHECK_FALSE(worse->has_value());
  auto equal = keeper.Offer(**weights, Result(60, 1024), 60);
  REQUIRE(equal.ok());
  CHECK_FALSE(equal->has_value());
  CHECK(fs::read_symlink(link) == "best-v20");

  auto better = keeper.Offer(**weights, Result(80, 1500), 80);
  REQUIRE(better.ok());
  REQUIRE(better->has_value());
  CHECK((*better)->policy_version == 80);
  CHECK(fs::read_symlink(link) == "best-v80");
  CHECK_FALSE(fs::exists(fs::path(dir.path()) / "best-v20"));

  // A restarted trainer keeps the best so far.
  BestPolicyKeeper restarted(options);
  REQUIRE(restarted.best().has_value());
  CHECK(restarted.best()->policy_version == 80);
  CHECK(restarted.best()->accuracy == Approx(1500.0 / 2048));
  auto after_restart = restarted.Offer(**weights, Result(100, 1400), 100);
  REQUIRE(after_restart.ok());
  CHECK_FALSE(after_restart->has_value());
  CHECK(fs::read_symlink(link) == "best-v80");
}

}  // namespace
}  // namespace tandem::trainer
