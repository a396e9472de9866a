#include "common/cluster/cluster_status.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster/member_names.h"

namespace tandem::cluster {
namespace {

using cluster::MemberStateName;
using cluster::RoleName;

}  // namespace

std::string FormatClusterStatus(
    const tandem::v1::GetClusterStatusResponse& status, int64_t now_unix_ms) {
  std::string out = absl::StrFormat(
      "policy version %d  membership epoch %d  group size %d  max lag %d\n",
      status.policy_version(), status.membership_epoch(), status.group_size(),
      status.max_lag());
  absl::StrAppend(&out,
                  absl::StrFormat("%-14s %-9s %-9s %-22s %-8s %8s %10s %9s\n",
                                  "MEMBER", "ROLE", "STATE", "GRPC", "VERSION",
                                  "RUNNING", "TOK/S", "HB AGE"));
  for (const auto& m : status.members()) {
    const double age_s =
        static_cast<double>(now_unix_ms - m.last_heartbeat_unix_ms()) / 1000.0;
    absl::StrAppend(
        &out, absl::StrFormat("%-14s %-9s %-9s %-22s %-8d %8d %10.1f %8.1fs\n",
                              m.member_id(), RoleName(m.role()),
                              MemberStateName(m.state()), m.grpc_address(),
                              m.policy_version(), m.load().running(),
                              m.load().tokens_per_second(), age_s));
  }
  const auto& q = status.queues();
  absl::StrAppend(
      &out, absl::StrFormat(
                "queues: pending %d  leased %d  scoring %d  ready %d  "
                "training %d\n",
                q.pending_prompts(), q.leased_prompts(), q.scoring_samples(),
                q.ready_groups(), q.training_groups()));
  const auto& c = status.counters();
  absl::StrAppend(
      &out, absl::StrFormat(
                "groups: trained %d  dropped stale %d  requeued %d  "
                "lost %d; batches released %d\n",
                c.groups_trained(), c.groups_dropped_stale(),
                c.groups_requeued(), c.groups_lost(), c.batches_released()));
  return out;
}

}  // namespace tandem::cluster
