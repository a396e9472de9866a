// Issue 6: on the built-in task with an in-process rollout (no daemons), a
// few hundred GRPO steps raise held-out accuracy above the supervised warm
// start -- the algorithm learns before the distributed system is involved.
// The warm start is the demo's (3-digit addition, saved at >= 45% held-out
// accuracy); both stages are seeded and single-threaded, so the run is
// deterministic on a given build. Measured numbers: docs/demo.md.

// LibTorch before Catch2, so that CHECK is Catch2's.
#include <ATen/ATen.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "services/trainer/tools/inprocess_rl.h"
#include "services/trainer/tools/sft/sft_trainer.h"

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;

TEST_CASE("GRPO with an in-process rollout raises held-out accuracy above "
          "the warm start",
          "[rl][slow]") {
  std::string pattern =
      (fs::temp_directory_path() / "trainer_inprocess_rl_test.XXXXXX")
          .string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const fs::path dir = pattern;

  // The demo's warm start: tandem-trainer sft's defaults.
  sft::SftOptions sft;
  sft.output_dir = (dir / "warm-start").string();
  auto warm = sft::RunSft(sft);
  REQUIRE(warm.ok());
  std::printf("warm start: step %ld, held-out %.3f\n",
              static_cast<long>(warm->saved_step), warm->saved_accuracy);

  InProcessRlOptions rl;
  rl.model_path = sft.output_dir;
  rl.digits = 3;
  rl.subtraction = false;
  rl.steps = 200;
  rl.prompts_per_step = 16;
  rl.group_size = 8;
  rl.eval_every = 50;
  rl.eval_problems = 512;
  rl.grpo.lr = 3e-4;
  auto result = RunInProcessRl(rl, [](const InProcessRlPoint& p) {
    std::printf("rl step %ld: held-out %.3f, reward %.3f, %.1fs\n",
                static_cast<long>(p.step), p.heldout_accuracy, p.reward_mean,
                p.seconds);
    std::fflush(stdout);
  });
  REQUIRE(result.ok());
  REQUIRE(result->curve.size() == 5);
  const double start = result->curve.front().heldout_accuracy;
  double best = 0.0;
  for (size_t i = 1; i < result->curve.size(); ++i) {
    best = std::max(best, result->curve[i].heldout_accuracy);
  }
  // Measured (docs/demo.md): 50.6% -> 56.2, 56.6, 58.4, 57.4% at steps
  // 50..200. Evaluations move by a few points (512 problems, and the policy
  // itself moves), so: the last two evaluations average at least 2 points
  // above the start and the best is at least 4 points above it. Margins
  // in that run: +7.3 points against 2 for the average (5.3 to spare), +7.8
  // against 4 for the best (3.8 to spare, about 1.7 standard errors of a
  // 512-problem evaluation); another CPU's kernels change the trajectory,
  // so these bounds sit well under what was measured rather than near it.
  const size_t n = result->curve.size();
  CHECK((result->curve[n - 1].heldout_accuracy +
         result->curve[n - 2].heldout_accuracy) / 2 >= start + 0.02);
  CHECK(best >= start + 0.04);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::trainer
