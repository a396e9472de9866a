#include "services/launcher/progress.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::launcher {

std::string FormatPause(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.0fus", seconds * 1e6);
  if (seconds < 1.0) return absl::StrFormat("%.1fms", seconds * 1e3);
  return absl::StrFormat("%.2fs", seconds);
}

namespace {

std::string Percent(double fraction) {
  return absl::StrFormat("%.1f%%", 100.0 * fraction);
}

std::string HeldoutPart(const tandem::v1::TrainerStatus& trainer) {
  if (!trainer.heldout_evaluated()) return "held-out -";
  if (trainer.heldout_policy_version() ==
      trainer.initial_heldout_policy_version()) {
    return absl::StrCat("held-out ", Percent(trainer.heldout_accuracy()),
                        " (v ", trainer.heldout_policy_version(), ")");
  }
  std::string part =
      absl::StrCat("held-out ", Percent(trainer.initial_heldout_accuracy()),
                   " -> ", Percent(trainer.heldout_accuracy()), " (v ",
                   trainer.heldout_policy_version(), ")");
  // One evaluation's noise is not a trend: the mean of the last few and the
  // best so far (trainers that report them).
  if (trainer.heldout_smoothed_window() > 1) {
    absl::StrAppend(&part, ", mean of last ", trainer.heldout_smoothed_window(),
                    " ", Percent(trainer.heldout_smoothed_accuracy()));
  }
  if (trainer.heldout_smoothed_window() > 0) {
    absl::StrAppend(&part, ", best ", Percent(trainer.heldout_best_accuracy()),
                    " (v ", trainer.heldout_best_policy_version(), ")");
  }
  return part;
}

}  // namespace

std::string FormatProgressLine(const ProgressSnapshot& snapshot) {
  const auto& cluster = snapshot.cluster;
  int alive = 0;
  int total = 0;
  double tokens_per_second = 0;
  for (const auto& m : cluster.members()) {
    if (m.state() == tandem::v1::MEMBER_STATE_LEFT) continue;
    ++total;
    if (m.state() == tandem::v1::MEMBER_STATE_ALIVE) ++alive;
    if (m.role() == tandem::v1::ROLE_ROLLOUT) {
      tokens_per_second += m.load().tokens_per_second();
    }
  }
  std::vector<std::string> parts;
  parts.push_back(absl::StrCat("v ", cluster.policy_version()));
  if (snapshot.trainer.has_value()) {
    const auto& t = *snapshot.trainer;
    parts.push_back(absl::StrFormat("reward %.2f", t.last_reward_mean()));
    parts.push_back(HeldoutPart(t));
  }
  parts.push_back(absl::StrFormat("%.0f tok/s", tokens_per_second));
  if (snapshot.trainer.has_value() && snapshot.trainer->step() > 0) {
    parts.push_back(absl::StrFormat("staleness %.1f (max %d, bound %d)",
                                    snapshot.trainer->last_mean_staleness(),
                                    snapshot.trainer->last_max_staleness(),
                                    cluster.max_lag()));
  }
  double pause = -1;
  for (const auto& r : snapshot.rollouts) {
    if (r.policy_version() > 0) {
      pause = std::max(pause, r.last_update_pause_seconds());
    }
  }
  if (pause >= 0) parts.push_back("pause " + FormatPause(pause));
  parts.push_back(absl::StrFormat("members %d/%d", alive, total));
  std::string line;
  for (const auto& p : parts) {
    if (!line.empty()) line += " | ";
    line += p;
  }
  return line;
}

std::string FormatRunSummary(const ProgressSnapshot& last,
                             const RunSummary& summary) {
  std::string out = "Run summary\n";
  if (last.trainer.has_value() && last.trainer->heldout_evaluated()) {
    const auto& t = *last.trainer;
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  held-out accuracy  %s (v %d) -> %s (v %d), %+.1f points on "
            "%d problems\n",
            Percent(t.initial_heldout_accuracy()),
            t.initial_heldout_policy_version(), Percent(t.heldout_accuracy()),
            t.heldout_policy_version(),
            100.0 * (t.heldout_accuracy() - t.initial_heldout_accuracy()),
            t.heldout_problems()));
    if (t.heldout_smoothed_window() > 0) {
      absl::StrAppend(
          &out,
          absl::StrFormat(
              "  held-out smoothed  %s (mean of the last %d evaluations)\n",
              Percent(t.heldout_smoothed_accuracy()),
              t.heldout_smoothed_window()));
      absl::StrAppend(&out,
                      absl::StrFormat("  best policy        %s (v %d)%s\n",
                                      Percent(t.heldout_best_accuracy()),
                                      t.heldout_best_policy_version(),
                                      t.heldout_best_path().empty()
                                          ? ""
                                          : ": " + t.heldout_best_path()));
    }
  } else {
    absl::StrAppend(&out, "  held-out accuracy  not evaluated\n");
  }
  if (summary.warm_start_time > absl::ZeroDuration()) {
    absl::StrAppend(
        &out, absl::StrFormat("  warm start         %.0f s\n",
                              absl::ToDoubleSeconds(summary.warm_start_time)));
  }
  const double rl_seconds = absl::ToDoubleSeconds(summary.rl_time);
  absl::StrAppend(&out,
                  absl::StrFormat("  RL time            %.0f s\n", rl_seconds));
  absl::StrAppend(
      &out,
      absl::StrFormat(
          "  generated tokens   %d (%.0f tok/s)\n", summary.generated_tokens,
          rl_seconds > 0 ? summary.generated_tokens / rl_seconds : 0.0));
  absl::StrAppend(
      &out, absl::StrFormat("  policy versions    %d, trained groups %d, "
                            "dropped stale %d\n",
                            last.cluster.policy_version(),
                            last.cluster.counters().groups_trained(),
                            last.cluster.counters().groups_dropped_stale()));
  {
    // Work a trainer restart took out of the weights, and dead trainers'
    // batches returned: never silent.
    const auto& c = last.cluster.counters();
    if (c.groups_requeued() + c.groups_lost() + c.batches_released() > 0) {
      absl::StrAppend(
          &out, absl::StrFormat("  trainer restarts   %d groups trained again, "
                                "%d groups lost, %d batches released\n",
                                c.groups_requeued(), c.groups_lost(),
                                c.batches_released()));
    }
  }
  if (!summary.checkpoint_path.empty()) {
    absl::StrAppend(&out, "  checkpoint         ", summary.checkpoint_path,
                    "\n");
  }
  if (!summary.export_path.empty()) {
    absl::StrAppend(&out, "  exported policy    ", summary.export_path, "\n");
  }
  return out;
}

}  // namespace tandem::launcher
