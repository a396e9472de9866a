// The trainer's training.* and eval.* keys: defaults, the schedule,
// clip-higher, loss aggregation and dynamic sampling keys accept what they
// document and refuse the rest with an error naming the key and the value
// (the daemon then exits 2: tests/integration/test_daemon_lifecycle.py).

#include "services/trainer/trainer_config.h"

#include <string>

#include "common/config/config_schema.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::trainer {
namespace {

using Catch::Matchers::Contains;

// Loads `yaml` like a daemon start does: schema first, then Validate().
absl::Status Load(const std::string& yaml, TrainerConfig* config) {
  config::ConfigSchema schema;
  RegisterFields(&schema, config);
  if (absl::Status s = schema.ApplyYamlText(yaml, "trainer.yaml"); !s.ok()) {
    return s;
  }
  return Validate(*config);
}

std::string Refusal(const std::string& yaml) {
  TrainerConfig config;
  const absl::Status s = Load(yaml, &config);
  REQUIRE_FALSE(s.ok());
  return std::string(s.message());
}

TEST_CASE("trainer defaults: symmetric clip, token mean, no dynamic "
          "sampling, constant lr, 2048 held-out problems") {
  TrainerConfig config;
  REQUIRE(Load("", &config).ok());
  CHECK(config.clip_low == 0.2);
  CHECK(config.clip_high == 0.2);
  CHECK(config.aggregation == "token");
  CHECK_FALSE(config.dynamic_sampling);
  CHECK(config.schedule == "constant");
  CHECK(config.warmup_steps == 0);
  CHECK(config.eval.problems == 2048);
}

TEST_CASE("the options of other GRPO implementations are accepted") {
  TrainerConfig config;
  REQUIRE(Load("training:\n"
               "  lr: 0.0002\n"
               "  warmup_steps: 20\n"
               "  schedule: linear\n"
               "  total_steps: 3000\n"
               "  min_lr_ratio: 0.1\n"
               "  clip_low: 0.2\n"
               "  clip_high: 0.28\n"
               "  aggregation: sequence\n"
               "  dynamic_sampling: true\n",
               &config)
              .ok());
  CHECK(config.schedule == "linear");
  CHECK(config.total_steps == 3000);
  CHECK(config.clip_high == 0.28);
  CHECK(config.aggregation == "sequence");
  CHECK(config.dynamic_sampling);
  CHECK(TrainingConfigJson(config).find("\"dynamic_sampling\":true") !=
        std::string::npos);
}

TEST_CASE("bad training values are refused naming the key and the value") {
  CHECK_THAT(Refusal("training:\n  schedule: step\n"),
             Contains("training.schedule") && Contains("'step'") &&
                 Contains("linear"));
  CHECK_THAT(
      Refusal("training:\n  schedule: linear\n  warmup_steps: 50\n"
              "  total_steps: 40\n"),
      Contains("training.schedule: linear needs training.total_steps > "
               "training.warmup_steps, got 40 <= 50"));
  CHECK_THAT(Refusal("training:\n  schedule: cosine\n"),
             Contains("training.schedule: cosine needs") &&
                 Contains("got 0 <= 0"));
  CHECK_THAT(Refusal("training:\n  warmup_steps: -1\n"),
             Contains("training.warmup_steps") && Contains("got -1"));
  CHECK_THAT(Refusal("training:\n  min_lr_ratio: 1.5\n"),
             Contains("training.min_lr_ratio") && Contains("got 1.5"));
  CHECK_THAT(Refusal("training:\n  clip_low: 1.5\n"),
             Contains("training.clip_low") && Contains("got 1.5"));
  CHECK_THAT(Refusal("training:\n  clip_high: -0.1\n"),
             Contains("training.clip_high") && Contains("got -0.1"));
  CHECK_THAT(Refusal("training:\n  aggregation: token_sum\n"),
             Contains("training.aggregation") && Contains("'token_sum'"));
  CHECK_THAT(Refusal("training:\n  dynamic_sampling: sometimes\n"),
             Contains("training.dynamic_sampling") &&
                 Contains("'sometimes'"));
  CHECK_THAT(Refusal("eval:\n  problems: 0\n"),
             Contains("eval.problems") && Contains("got 0"));
}

}  // namespace
}  // namespace tandem::trainer
