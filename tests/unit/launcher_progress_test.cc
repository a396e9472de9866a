// tandem-local's progress line, run summary and warm-start runner.

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "services/launcher/progress.h"
#include "services/launcher/warm_start.h"

#include <catch2/catch.hpp>

namespace fs = std::filesystem;
using tandem::launcher::FormatPause;
using tandem::launcher::FormatProgressLine;
using tandem::launcher::FormatRunSummary;
using tandem::launcher::ProgressSnapshot;
using tandem::launcher::RunSummary;

namespace {

ProgressSnapshot Snapshot() {
  ProgressSnapshot s;
  s.cluster.set_policy_version(120);
  s.cluster.set_max_lag(4);
  s.cluster.mutable_counters()->set_groups_trained(1900);
  s.cluster.mutable_counters()->set_groups_dropped_stale(7);
  auto* trainer = s.cluster.add_members();
  trainer->set_role(tandem::v1::ROLE_TRAINER);
  trainer->set_state(tandem::v1::MEMBER_STATE_ALIVE);
  for (double tps : {1000.5, 2000.0}) {
    auto* w = s.cluster.add_members();
    w->set_role(tandem::v1::ROLE_ROLLOUT);
    w->set_state(tandem::v1::MEMBER_STATE_ALIVE);
    w->mutable_load()->set_tokens_per_second(tps);
  }
  auto* dead = s.cluster.add_members();
  dead->set_role(tandem::v1::ROLE_ROLLOUT);
  dead->set_state(tandem::v1::MEMBER_STATE_DEAD);
  tandem::v1::TrainerStatus t;
  t.set_step(120);
  t.set_last_reward_mean(0.4123);
  t.set_heldout_evaluated(true);
  t.set_initial_heldout_accuracy(0.3125);
  t.set_initial_heldout_policy_version(0);
  t.set_heldout_accuracy(0.53125);
  t.set_heldout_policy_version(120);
  t.set_heldout_problems(256);
  t.set_last_mean_staleness(1.25);
  t.set_last_max_staleness(3);
  s.trainer = t;
  tandem::v1::RolloutStatus r1;
  r1.set_policy_version(118);
  r1.set_last_update_pause_seconds(52e-6);
  tandem::v1::RolloutStatus r2;
  r2.set_policy_version(119);
  r2.set_last_update_pause_seconds(2.5e-3);
  s.rollouts = {r1, r2};
  return s;
}

}  // namespace

TEST_CASE("progress line shows version, reward, accuracy, throughput, "
          "staleness, pause and members") {
  const std::string line = FormatProgressLine(Snapshot());
  CHECK(line ==
        "v 120 | reward 0.41 | held-out 31.2% -> 53.1% (v 120) | 3000 tok/s "
        "| staleness 1.2 (max 3, bound 4) | pause 2.5ms | members 3/4");
}

TEST_CASE("progress line before the trainer answers or evaluates") {
  ProgressSnapshot s = Snapshot();
  s.trainer.reset();
  s.rollouts.clear();
  CHECK(FormatProgressLine(s) == "v 120 | 3000 tok/s | members 3/4");
  s = Snapshot();
  s.trainer->set_heldout_policy_version(0);
  CHECK(FormatProgressLine(s).find("held-out 53.1% (v 0)") !=
        std::string::npos);
  s.trainer->set_heldout_evaluated(false);
  CHECK(FormatProgressLine(s).find("held-out - |") != std::string::npos);
}

TEST_CASE("progress line shows the smoothed and the best held-out accuracy") {
  ProgressSnapshot s = Snapshot();
  s.trainer->set_heldout_smoothed_accuracy(0.5);
  s.trainer->set_heldout_smoothed_window(5);
  s.trainer->set_heldout_best_accuracy(0.546875);
  s.trainer->set_heldout_best_policy_version(100);
  CHECK(FormatProgressLine(s).find(
            "held-out 31.2% -> 53.1% (v 120), mean of last 5 50.0%, best "
            "54.7% (v 100) | ") != std::string::npos);
  // After the first evaluation there is nothing to average yet.
  s.trainer->set_heldout_smoothed_window(1);
  CHECK(FormatProgressLine(s).find(
            "held-out 31.2% -> 53.1% (v 120), best 54.7% (v 100) | ") !=
        std::string::npos);
}

TEST_CASE("run summary names the best policy and the smoothed accuracy") {
  ProgressSnapshot s = Snapshot();
  s.trainer->set_heldout_smoothed_accuracy(0.5);
  s.trainer->set_heldout_smoothed_window(5);
  s.trainer->set_heldout_best_accuracy(0.546875);
  s.trainer->set_heldout_best_policy_version(100);
  s.trainer->set_heldout_best_path("/run/checkpoints/best");
  const std::string text = FormatRunSummary(s, RunSummary());
  CHECK(text.find("held-out smoothed  50.0% (mean of the last 5 "
                  "evaluations)") != std::string::npos);
  CHECK(text.find("best policy        54.7% (v 100): /run/checkpoints/best") !=
        std::string::npos);
}

TEST_CASE("pause formatting picks a unit") {
  CHECK(FormatPause(45e-6) == "45us");
  CHECK(FormatPause(3.21e-3) == "3.2ms");
  CHECK(FormatPause(1.5) == "1.50s");
}

TEST_CASE("run summary reports accuracy before and after") {
  RunSummary summary;
  summary.rl_time = absl::Seconds(600);
  summary.warm_start_time = absl::Seconds(150);
  summary.generated_tokens = 1200000;
  summary.checkpoint_path = "/run/checkpoints/step-120";
  summary.export_path = "/run/checkpoints/step-120/hf";
  const std::string text = FormatRunSummary(Snapshot(), summary);
  CHECK(text.find("31.2% (v 0) -> 53.1% (v 120), +21.9 points on 256 "
                  "problems") != std::string::npos);
  CHECK(text.find("RL time            600 s") != std::string::npos);
  CHECK(text.find("warm start         150 s") != std::string::npos);
  CHECK(text.find("1200000 (2000 tok/s)") != std::string::npos);
  CHECK(text.find("policy versions    120, trained groups 1900, dropped "
                  "stale 7") != std::string::npos);
  CHECK(text.find("exported policy    /run/checkpoints/step-120/hf") !=
        std::string::npos);
}

TEST_CASE("run summary counts the groups a trainer restart lost") {
  ProgressSnapshot last = Snapshot();
  CHECK(FormatRunSummary(last, RunSummary()).find("trainer restarts") ==
        std::string::npos);
  last.cluster.mutable_counters()->set_groups_requeued(12);
  last.cluster.mutable_counters()->set_groups_lost(5);
  last.cluster.mutable_counters()->set_batches_released(1);
  CHECK(FormatRunSummary(last, RunSummary())
            .find("trainer restarts   12 groups trained again, 5 groups "
                  "lost, 1 batches released") != std::string::npos);
}

namespace {

std::string Script(const fs::path& dir, const std::string& body) {
  const fs::path path = dir / "fake-trainer";
  std::ofstream(path) << "#!/bin/sh\n" << body;
  fs::permissions(path, fs::perms::owner_all);
  return path.string();
}

}  // namespace

TEST_CASE("warm start forwards the command's lines and returns its output") {
  const fs::path dir = fs::temp_directory_path() / "tandem-warm-start-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  tandem::launcher::WarmStartOptions options;
  options.trainer_binary =
      Script(dir, "echo \"args: $*\"\necho second\nprintf 'no newline'\n");
  options.output_dir = (dir / "out").string();
  options.log_path = (dir / "warm.log").string();
  options.sft_flags = {"--digits", "3"};
  std::vector<std::string> lines;
  auto result = tandem::launcher::RunWarmStart(
      options, [&](const std::string& l) { lines.push_back(l); });
  REQUIRE(result.ok());
  CHECK(*result == options.output_dir);
  CHECK(fs::is_directory(options.output_dir));
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "args: sft --output " + options.output_dir +
                        " --digits 3");
  CHECK(lines[2] == "no newline");
  std::ifstream log(options.log_path);
  std::string first;
  std::getline(log, first);
  CHECK(first.rfind("$ ", 0) == 0);

  SECTION("a failing command is an error naming it and the log") {
    options.trainer_binary = Script(dir, "echo broken >&2\nexit 3\n");
    auto failed =
        tandem::launcher::RunWarmStart(options, [](const std::string&) {});
    REQUIRE_FALSE(failed.ok());
    const std::string message(failed.status().message());
    CHECK(message.find("exit code 3") != std::string::npos);
    CHECK(message.find(options.trainer_binary) != std::string::npos);
    CHECK(message.find(options.log_path) != std::string::npos);
  }
  SECTION("a missing binary is an error, not a hang") {
    options.trainer_binary = (dir / "does-not-exist").string();
    std::vector<std::string> out;
    auto failed = tandem::launcher::RunWarmStart(
        options, [&](const std::string& l) { out.push_back(l); });
    REQUIRE_FALSE(failed.ok());
    CHECK(std::string(failed.status().message()).find("exit code 127") !=
          std::string::npos);
    REQUIRE_FALSE(out.empty());
    CHECK(out[0].find("cannot execute") != std::string::npos);
  }
  SECTION("SIGTERM to the launcher stops the command") {
    options.trainer_binary = Script(dir, "echo started\nexec sleep 30\n");
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigset_t old;
    pthread_sigmask(SIG_BLOCK, &set, &old);
    bool sent = false;
    auto cancelled = tandem::launcher::RunWarmStart(
        options, [&](const std::string&) {
          if (!sent) {
            sent = true;
            kill(getpid(), SIGTERM);
          }
        });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    CHECK(absl::IsCancelled(cancelled.status()));
  }
  fs::remove_all(dir);
}
