#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "coordinator_test_util.h"
#include "services/coordinator/group_ledger.h"

namespace tandem::coordinator {
namespace {

using testing::CountingPromptSource;
using testing::MakeSample;
using testing::MakeScore;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

GroupLedgerOptions Options(uint32_t group_size = 2) {
  GroupLedgerOptions options;
  options.group_size = group_size;
  options.max_lag = 2;
  options.lease_timeout = absl::Seconds(10);
  options.batch_timeout = absl::Seconds(30);
  options.groups_per_version = 100;
  options.id_prefix = "t";
  return options;
}

std::unique_ptr<GroupLedger> NewLedger(GroupLedgerOptions options,
                                       uint64_t prompts = 0) {
  return std::make_unique<GroupLedger>(
      options, std::make_unique<CountingPromptSource>(prompts));
}

// Submits every sample of `lease` at `version` and scores them.
void Complete(GroupLedger& ledger, const tandem::v1::PromptLease& lease,
              uint64_t version, double reward = 1.0) {
  tandem::v1::SubmitSamplesRequest request;
  request.set_member_id("w");
  for (uint32_t i = 0; i < lease.group_size(); ++i) {
    *request.add_samples() =
        MakeSample(lease.lease_id(), lease.group_id(), i, version);
  }
  auto result = ledger.Submit(request);
  REQUIRE(result.ok());
  REQUIRE(result->response.accepted() == lease.group_size());
  for (const ScoringTask& task : result->to_score) {
    ledger.RecordScore(task.group_id, task.sample_index, MakeScore(reward));
  }
}

tandem::v1::PullTrainingBatchRequest PullRequest(uint64_t version,
                                                 uint32_t max_groups = 0,
                                                 uint64_t max_tokens = 0) {
  tandem::v1::PullTrainingBatchRequest request;
  request.set_trainer_policy_version(version);
  request.set_max_groups(max_groups);
  request.set_max_tokens(max_tokens);
  return request;
}

TEST_CASE(
    "Ledger: a leased prompt becomes a ready group once all samples "
    "are scored, and is trained once",
    "[coordinator][ledger]") {
  GroupLedgerOptions options = Options(3);
  options.sampling.set_temperature(0.7f);
  auto ledger = NewLedger(options);
  auto leases = ledger->Lease("w", 1, 0, kT0);
  REQUIRE(leases.leases_size() == 1);
  const tandem::v1::PromptLease& lease = leases.leases(0);
  CHECK(lease.group_size() == 3);
  CHECK(lease.sampling().temperature() == 0.7f);
  CHECK(lease.prompt_id() == "p0");
  CHECK(lease.deadline_unix_ms() ==
        absl::ToUnixMillis(kT0 + absl::Seconds(10)));
  CHECK(lease.prompt_token_ids_size() == 4);

  tandem::v1::SubmitSamplesRequest request;
  request.set_member_id("w");
  for (uint32_t i = 0; i < 3; ++i) {
    *request.add_samples() =
        MakeSample(lease.lease_id(), lease.group_id(), i, 0);
  }
  auto result = ledger->Submit(request);
  REQUIRE(result.ok());
  SubmitResult& submitted = *result;
  CHECK(submitted.response.accepted() == 3);
  REQUIRE(submitted.to_score.size() == 3);
  CHECK(submitted.to_score[0].item.verifier() == "arith");
  CHECK(submitted.to_score[0].item.metadata().at("answer") == "7");
  CHECK(submitted.to_score[0].item.item_id() == lease.lease_id() + "/0");
  CHECK(ledger->Stats().leased_prompts == 0);
  CHECK(ledger->Stats().scoring_samples == 3);
  CHECK(ledger->Pull(PullRequest(0), kT0).batch_id().empty());

  CHECK_FALSE(ledger->RecordScore(lease.group_id(), 0, MakeScore(1)));
  CHECK_FALSE(ledger->RecordScore(lease.group_id(), 0, MakeScore(0)));  // dup
  CHECK_FALSE(ledger->RecordScore(lease.group_id(), 1, MakeScore(0)));
  CHECK(ledger->RecordScore(lease.group_id(), 2, MakeScore(1)));
  CHECK(ledger->Stats().ready_groups == 1);

  auto batch = ledger->Pull(PullRequest(0), kT0);
  REQUIRE(batch.groups_size() == 1);
  const tandem::v1::ScoredGroup& group = batch.groups(0);
  CHECK(group.group_id() == lease.group_id());
  CHECK(group.prompt_id() == "p0");
  CHECK(group.samples_size() == 3);
  CHECK(group.samples(0).score().reward() == 1.0);
  CHECK(group.samples(0).score().reward() == 1.0);  // first score kept
  CHECK(group.samples(1).score().reward() == 0.0);
  // The trainer learns the temperature to take its log-probs at.
  CHECK(group.sampling().temperature() == 0.7f);
  CHECK(ledger->Stats().training_groups == 1);
  auto commit = ledger->Commit(batch.batch_id(), 1);
  REQUIRE(commit.ok());
  CHECK(commit->groups == 1);
  // Committing again trains nothing more.
  CHECK(ledger->Commit(batch.batch_id(), 1)->groups == 1);
  LedgerStats stats = ledger->Stats();
  CHECK(stats.groups_trained == 1);
  CHECK(stats.groups_completed == 1);
  CHECK(stats.training_groups == 0);
  CHECK(ledger->Commit("nope", 1).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("Ledger: submissions are idempotent and unknown leases rejected",
          "[coordinator][ledger]") {
  auto ledger = NewLedger(Options(2));
  auto lease = ledger->Lease("w", 1, 0, kT0).leases(0);
  tandem::v1::SubmitSamplesRequest request;
  request.set_member_id("w");
  *request.add_samples() = MakeSample(lease.lease_id(), lease.group_id(), 0, 0);
  CHECK(ledger->Submit(request)->response.accepted() == 1);
  SubmitResult again = *ledger->Submit(request);
  CHECK(again.response.accepted() == 0);
  CHECK(again.response.duplicates() == 1);
  CHECK(again.to_score.empty());

  tandem::v1::SubmitSamplesRequest bad;
  bad.set_member_id("w");
  *bad.add_samples() = MakeSample("no-such-lease", "g", 0, 0);
  *bad.add_samples() = MakeSample(lease.lease_id(), lease.group_id(), 5, 0);
  *bad.add_samples() = MakeSample(lease.lease_id(), "other-group", 1, 0);
  SubmitResult rejected = *ledger->Submit(bad);
  CHECK(rejected.response.rejected_sample_ids_size() == 3);

  // After the last sample the lease is finished; resubmissions are still
  // duplicates, not rejections.
  tandem::v1::SubmitSamplesRequest last;
  last.set_member_id("w");
  *last.add_samples() = MakeSample(lease.lease_id(), lease.group_id(), 1, 0);
  CHECK(ledger->Submit(last)->response.accepted() == 1);
  CHECK(ledger->Submit(last)->response.duplicates() == 1);
  CHECK(ledger->Stats().samples_received == 2);
}

TEST_CASE(
    "Ledger: expired, returned and dead members' leases go back to "
    "the front of the queue",
    "[coordinator][ledger]") {
  auto ledger = NewLedger(Options(2));
  auto first = ledger->Lease("a", 2, 0, kT0);
  REQUIRE(first.leases_size() == 2);
  const auto old = first.leases(0);
  // A partial submission is lost with the lease.
  tandem::v1::SubmitSamplesRequest partial;
  partial.set_member_id("a");
  *partial.add_samples() = MakeSample(old.lease_id(), old.group_id(), 0, 0);
  REQUIRE(ledger->Submit(partial).ok());
  CHECK(ledger->Stats().scoring_samples == 1);

  SECTION("expiry, with renewal by heartbeat") {
    RenewResult renewed = ledger->Renew("a", {}, kT0 + absl::Seconds(5));
    CHECK(renewed.renewed == 2);
    CHECK(ledger->ExpireLeases(kT0 + absl::Seconds(11)) == 0);
    // Only the second lease is renewed explicitly.
    ledger->Renew("a", {first.leases(1).lease_id()}, kT0 + absl::Seconds(14));
    CHECK(ledger->ExpireLeases(kT0 + absl::Seconds(16)) == 1);
    CHECK(ledger->Stats().lease_expiries == 1);
  }
  SECTION("return") {
    CHECK(ledger->Return("b", {old.lease_id()}) == 0);  // not b's lease
    CHECK(ledger->Return("a", {old.lease_id(), "nope"}) == 1);
  }
  SECTION("member death") {
    CHECK(ledger->ReleaseMember("a") == 2);
    CHECK(ledger->Stats().pending_prompts == 2);
    ledger->Lease("b", 1, 0, kT0);  // takes p0 back
  }
  CHECK(ledger->Stats().scoring_samples == 0);
  auto renewed = ledger->Renew("a", {old.lease_id()}, kT0);
  CHECK(renewed.unknown == std::vector<std::string>{old.lease_id()});
  // The late score of the abandoned group is ignored.
  CHECK_FALSE(ledger->RecordScore(old.group_id(), 0, MakeScore(1)));
  // The prompt is leased again first, under new ids.
  auto again = ledger->Lease("b", 1, 0, kT0);
  REQUIRE(again.leases_size() == 1);
  const auto& fresh = again.leases(0);
  if (fresh.prompt_id() == "p0") {
    CHECK(fresh.lease_id() != old.lease_id());
    CHECK(fresh.group_id() != old.group_id());
  } else {
    CHECK(fresh.prompt_id() == "p1");  // member death: p0 went first
  }
  tandem::v1::SubmitSamplesRequest stale;
  *stale.add_samples() = MakeSample(old.lease_id(), old.group_id(), 1, 0);
  CHECK(ledger->Submit(stale)->response.rejected_sample_ids_size() == 1);
}

TEST_CASE("Ledger: training batches respect the token budget and group bound",
          "[coordinator][ledger]") {
  auto ledger = NewLedger(Options(2));
  auto leases = ledger->Lease("w", 5, 0, kT0);
  for (const auto& lease : leases.leases()) Complete(*ledger, lease, 0);
  // Each group: 2 samples x (4 prompt + 2 completion) = 12 tokens.
  auto by_tokens = ledger->Pull(PullRequest(0, 0, 30), kT0);
  CHECK(by_tokens.groups_size() == 2);
  auto by_groups = ledger->Pull(PullRequest(0, 1, 0), kT0);
  CHECK(by_groups.groups_size() == 1);
  auto oversized = ledger->Pull(PullRequest(0, 0, 5), kT0);
  CHECK(oversized.groups_size() == 1);  // alone, though over budget
  auto rest = ledger->Pull(PullRequest(0), kT0);
  CHECK(rest.groups_size() == 1);
  CHECK(ledger->Pull(PullRequest(0), kT0).batch_id().empty());
  std::set<std::string> ids;
  for (const auto* batch : {&by_tokens, &by_groups, &oversized, &rest}) {
    for (const auto& group : batch->groups()) ids.insert(group.group_id());
  }
  CHECK(ids.size() == 5);
}

TEST_CASE(
    "Ledger: uncommitted batches are handed out again; each group is "
    "trained at most once",
    "[coordinator][ledger]") {
  auto ledger = NewLedger(Options(1));
  auto leases = ledger->Lease("w", 2, 0, kT0);
  for (const auto& lease : leases.leases()) Complete(*ledger, lease, 0);
  auto first = ledger->Pull(PullRequest(0), kT0);
  REQUIRE(first.groups_size() == 2);
  CHECK(ledger->ExpireBatches(kT0 + absl::Seconds(29)) == 0);
  CHECK(ledger->ExpireBatches(kT0 + absl::Seconds(31)) == 1);
  CHECK(ledger->Stats().ready_groups == 2);
  SECTION("a late commit before the groups were handed out again counts") {
    auto commit = ledger->Commit(first.batch_id(), 1);
    REQUIRE(commit.ok());
    CHECK(commit->groups == 2);
    CHECK(ledger->Stats().ready_groups == 0);
    CHECK(ledger->Pull(PullRequest(0), kT0).batch_id().empty());
  }
  SECTION("a late commit after they were handed out again is refused") {
    auto second = ledger->Pull(PullRequest(0), kT0 + absl::Seconds(31));
    REQUIRE(second.groups_size() == 2);
    CHECK(second.groups(0).group_id() == first.groups(0).group_id());
    CHECK(ledger->Commit(first.batch_id(), 1).status().code() ==
          absl::StatusCode::kFailedPrecondition);
    CHECK(ledger->Commit(second.batch_id(), 1)->groups == 2);
  }
  CHECK(ledger->Stats().groups_trained == 2);
}

TEST_CASE("Ledger: policy versions go up by one", "[coordinator][ledger]") {
  auto ledger = NewLedger(Options());
  CHECK(ledger->PublishVersion(1).ok());
  CHECK(ledger->PublishVersion(1).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(ledger->PublishVersion(3).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(ledger->PublishVersion(2).ok());
  CHECK(ledger->policy_version() == 2);
}

TEST_CASE(
    "Ledger: groups beyond max_lag are dropped, or kept when "
    "configured",
    "[coordinator][ledger]") {
  for (bool keep : {false, true}) {
    GroupLedgerOptions options = Options(1);
    options.keep_stale = keep;
    auto ledger = NewLedger(options);
    auto leases = ledger->Lease("w", 2, 0, kT0);
    Complete(*ledger, leases.leases(0), 0);
    // Version 3 is max_lag (2) + 1 ahead of the first group's tokens.
    for (uint64_t v = 1; v <= 3; ++v) REQUIRE(ledger->PublishVersion(v).ok());
    Complete(*ledger, leases.leases(1), 1);  // lag 2 at version 3: fine
    auto batch = ledger->Pull(PullRequest(3), kT0);
    if (keep) {
      CHECK(batch.groups_size() == 2);
      CHECK(ledger->Stats().groups_kept_stale == 1);
    } else {
      CHECK(batch.groups_size() == 1);
      CHECK(batch.groups(0).min_policy_version() == 1);
      CHECK(batch.dropped_stale_groups() == 1);
      CHECK(ledger->Stats().groups_dropped_stale == 1);
      // The dropped group's prompt is generated again, before new ones.
      auto again = ledger->Lease("w", 1, 3, kT0);
      REQUIRE(again.leases_size() == 1);
      CHECK(again.leases(0).prompt_id() == leases.leases(0).prompt_id());
    }
  }
}

TEST_CASE(
    "Ledger: a finite dataset is trained whole although groups go stale",
    "[coordinator][ledger]") {
  // Two prompts, one epoch. The first group is generated at version 0 and
  // scored only after the trainer reached version 3 (max_lag 2): dropped,
  // its prompt leased again and trained then.
  auto ledger = NewLedger(Options(1), /*prompts=*/2);
  auto first = ledger->Lease("w", 1, 0, kT0);
  REQUIRE(first.leases_size() == 1);
  for (uint64_t v = 1; v <= 3; ++v) REQUIRE(ledger->PublishVersion(v).ok());
  Complete(*ledger, first.leases(0), 0);
  CHECK(ledger->Stats().groups_dropped_stale == 1);
  std::set<std::string> trained;
  for (int round = 0; round < 2; ++round) {
    auto leases = ledger->Lease("w", 1, 3, kT0);
    REQUIRE(leases.leases_size() == 1);
    Complete(*ledger, leases.leases(0), 3);
    auto batch = ledger->Pull(PullRequest(3), kT0);
    REQUIRE(batch.groups_size() == 1);
    trained.insert(batch.groups(0).prompt_id());
    REQUIRE(ledger->Commit(batch.batch_id(), 4).ok());
  }
  CHECK(trained == std::set<std::string>{"p0", "p1"});
  auto done = ledger->Lease("w", 1, 3, kT0);
  CHECK(done.leases_size() == 0);
  CHECK(done.exhausted());
}

TEST_CASE("Ledger: a worker behind the trainer gets fewer groups in flight",
          "[coordinator][ledger]") {
  // max_lag 2, 2 groups per version: a worker at the latest version may
  // have 2 * 2 groups in flight, one a version behind 1 * 2, and one
  // max_lag behind still 1 * 2 (its groups are trained in the next batch).
  for (uint64_t lag : {0, 1, 2}) {
    CAPTURE(lag);
    GroupLedgerOptions options = Options(1);
    options.groups_per_version = 2;
    auto ledger = NewLedger(options);
    for (uint64_t v = 1; v <= 2; ++v) REQUIRE(ledger->PublishVersion(v).ok());
    auto leases = ledger->Lease("w", 10, 2 - lag, kT0);
    CHECK(leases.leases_size() == (lag == 0 ? 4 : 2));
    CHECK(ledger->Lease("w", 1, 2 - lag, kT0).leases_size() == 0);
  }
}

TEST_CASE(
    "Ledger: dispatch stops at the in-flight bound and for lagging "
    "workers",
    "[coordinator][ledger]") {
  GroupLedgerOptions options = Options(1);
  options.groups_per_version = 2;  // max_lag 2 * 2 = 4 in flight
  auto ledger = NewLedger(options);
  auto leases = ledger->Lease("w", 10, 0, kT0);
  CHECK(leases.leases_size() == 4);
  auto none = ledger->Lease("w", 1, 0, kT0);
  CHECK(none.leases_size() == 0);
  CHECK(none.retry_after_ms() > 0);
  CHECK_FALSE(none.exhausted());
  // Training frees room.
  Complete(*ledger, leases.leases(0), 0);
  auto batch = ledger->Pull(PullRequest(0), kT0);
  CHECK(ledger->Lease("w", 1, 0, kT0).leases_size() == 0);  // still training
  REQUIRE(ledger->Commit(batch.batch_id(), 1).ok());
  CHECK(ledger->Lease("w", 5, 0, kT0).leases_size() == 1);
  // A worker more than max_lag versions behind gets nothing.
  REQUIRE(ledger->ReleaseMember("w") == 4);
  for (uint64_t v = 1; v <= 3; ++v) REQUIRE(ledger->PublishVersion(v).ok());
  CHECK(ledger->Lease("old", 1, 0, kT0).leases_size() == 0);
  CHECK(ledger->Lease("new", 1, 1, kT0).leases_size() == 1);
}

TEST_CASE("Ledger: the in-flight bound follows the trainer's batch size",
          "[coordinator][ledger]") {
  GroupLedgerOptions options = Options(1);  // max_lag 2, 100 per version
  auto ledger = NewLedger(options);
  auto first = ledger->Lease("w", 3, 0, kT0);
  REQUIRE(first.leases_size() == 3);
  Complete(*ledger, first.leases(0), 0);
  // The trainer takes one group per step: at most 2 * 1 groups in flight.
  auto batch = ledger->Pull(PullRequest(0, /*max_groups=*/1), kT0);
  REQUIRE(batch.groups_size() == 1);
  REQUIRE(ledger->Commit(batch.batch_id(), 1).ok());
  CHECK(ledger->Lease("w", 5, 0, kT0).leases_size() == 0);  // 2 in flight
  Complete(*ledger, first.leases(1), 0);
  auto second = ledger->Pull(PullRequest(1, /*max_groups=*/1), kT0);
  REQUIRE(ledger->Commit(second.batch_id(), 2).ok());
  CHECK(ledger->Lease("w", 5, 1, kT0).leases_size() == 1);
}

TEST_CASE("Ledger: a finite source is exhausted once every lease is done",
          "[coordinator][ledger]") {
  auto ledger = NewLedger(Options(1), /*prompts=*/2);
  auto leases = ledger->Lease("w", 5, 0, kT0);
  CHECK(leases.leases_size() == 2);
  auto empty = ledger->Lease("w", 1, 0, kT0);
  CHECK(empty.leases_size() == 0);
  CHECK_FALSE(empty.exhausted());  // leases may still come back
  ledger->Return("w", {leases.leases(0).lease_id()});
  auto back = ledger->Lease("w", 5, 0, kT0);
  REQUIRE(back.leases_size() == 1);
  Complete(*ledger, back.leases(0), 0);
  Complete(*ledger, leases.leases(1), 0);
  CHECK(ledger->Lease("w", 1, 0, kT0).exhausted());
  CHECK(ledger->Stats().dataset_exhausted);
}

}  // namespace
}  // namespace tandem::coordinator
