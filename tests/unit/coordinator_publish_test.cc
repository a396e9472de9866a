// The publish protocol of GroupLedger (group_ledger.h): a version is
// published together with the batch that trained it, idempotently; a dead
// trainer's batch is released at once, and so is a batch its trainer hands
// back (ReleaseTrainingBatch); a trainer resuming from an older
// checkpoint gets the groups it no longer holds trained again or counted
// lost. With and without a journal (restarts at each crash point).

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "coordinator_test_util.h"
#include "services/coordinator/group_ledger.h"
#include "services/coordinator/journal.h"

namespace tandem::coordinator {
namespace {

using testing::CountingPromptSource;
using testing::MakeSample;
using testing::MakeScore;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("tandem_publish_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter_++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

GroupLedgerOptions Options(const std::string& prefix = "a") {
  GroupLedgerOptions options;
  options.group_size = 2;
  options.max_lag = 2;
  options.lease_timeout = absl::Seconds(10);
  options.batch_timeout = absl::Seconds(30);
  options.groups_per_version = 100;
  options.id_prefix = prefix;
  return options;
}

std::unique_ptr<GroupLedger> NewLedger() {
  return std::make_unique<GroupLedger>(
      Options(), std::make_unique<CountingPromptSource>(0));
}

// A ledger recovered from the journal in `dir` (incarnation `prefix`).
std::unique_ptr<GroupLedger> Recovered(const std::string& dir,
                                       const std::string& prefix,
                                       absl::Time now = kT0) {
  auto ledger = std::make_unique<GroupLedger>(
      Options(prefix), std::make_unique<CountingPromptSource>(0));
  auto journal = Journal::Open(dir);
  REQUIRE(journal.ok());
  std::vector<ScoringTask> to_score;
  REQUIRE(ledger->Recover(std::move(journal).value(), now, &to_score).ok());
  return ledger;
}

// Leases `n` prompts and delivers their groups scored, every token
// generated at `version`; returns the group ids.
std::vector<std::string> ReadyGroups(GroupLedger& ledger, int n,
                                     uint64_t version) {
  auto leases = ledger.Lease("w", n, version, kT0);
  REQUIRE(leases.leases_size() == n);
  std::vector<std::string> ids;
  for (const auto& lease : leases.leases()) {
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
      ledger.RecordScore(task.group_id, task.sample_index, MakeScore(1));
    }
    ids.push_back(lease.group_id());
  }
  return ids;
}

tandem::v1::PullTrainingBatchResponse Pull(GroupLedger& ledger,
                                           const std::string& trainer,
                                           uint64_t version,
                                           uint32_t max_groups = 0) {
  tandem::v1::PullTrainingBatchRequest request;
  request.set_member_id(trainer);
  request.set_trainer_policy_version(version);
  request.set_max_groups(max_groups);
  return ledger.Pull(request, kT0);
}

absl::StatusOr<PublishResult> Publish(GroupLedger& ledger, uint64_t version,
                                      const std::string& batch_id) {
  tandem::v1::WeightManifest manifest;
  manifest.set_policy_version(version);
  return ledger.PublishTrainedVersion(manifest, "trainer:1", batch_id);
}

std::vector<std::string> GroupIds(
    const tandem::v1::PullTrainingBatchResponse& batch) {
  std::vector<std::string> ids;
  for (const auto& g : batch.groups()) ids.push_back(g.group_id());
  return ids;
}

TEST_CASE(
    "Publish: a batch-keyed publish commits its batch, and the same "
    "publish again is acknowledged without training anything twice",
    "[coordinator][publish]") {
  auto ledger = NewLedger();
  ReadyGroups(*ledger, 2, 0);
  auto batch = Pull(*ledger, "t", 0);
  REQUIRE(batch.groups_size() == 2);
  CHECK(ledger->Stats().training_groups == 2);

  auto first = Publish(*ledger, 1, batch.batch_id());
  REQUIRE(first.ok());
  CHECK_FALSE(first->duplicate);
  CHECK(first->commit.groups == 2);
  CHECK(first->commit.staleness == std::vector<uint64_t>{0, 0});
  LedgerStats stats = ledger->Stats();
  CHECK(stats.policy_version == 1);
  CHECK(stats.groups_trained == 2);
  CHECK(stats.training_groups == 0);

  // The trainer never got the answer and sends the same publish again.
  auto again = Publish(*ledger, 1, batch.batch_id());
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK(ledger->Stats().groups_trained == 2);
  CHECK(ledger->policy_version() == 1);

  // The batch cannot make a second version, and versions still go up by
  // one.
  auto twice = Publish(*ledger, 2, batch.batch_id());
  CHECK(absl::IsFailedPrecondition(twice.status()));
  CHECK(twice.status().message().find("already committed") !=
        std::string::npos);
  auto skip = Publish(*ledger, 3, "");
  CHECK(absl::IsFailedPrecondition(skip.status()));
  CHECK(skip.status().message().find("expected 2, got 3") != std::string::npos);
  auto unknown = Publish(*ledger, 2, "no-such-batch");
  CHECK(absl::IsFailedPrecondition(unknown.status()));
  CHECK(unknown.status().message().find("no-such-batch") != std::string::npos);
  CHECK(ledger->Stats().groups_trained == 2);
  CHECK(ledger->policy_version() == 1);
  // A version without a batch only announces.
  REQUIRE(Publish(*ledger, 2, "").ok());
  CHECK(ledger->policy_version() == 2);
}

TEST_CASE(
    "Publish: a coordinator restarted at any point of the publish converges "
    "on the trainer's version with each group trained once",
    "[coordinator][publish][journal]") {
  TempDir dir;
  auto first = Recovered(dir.path(), "a");
  ReadyGroups(*first, 3, 0);
  auto batch = Pull(*first, "t", 0, 2);
  REQUIRE(batch.groups_size() == 2);

  SECTION("killed after handing out the batch, before the publish") {
    // Nothing but the pull's own sync: the batch must survive.
    first.reset();
    auto second = Recovered(dir.path(), "b", kT0 + absl::Minutes(10));
    CHECK(second->Stats().training_groups == 2);
    // Its deadline was renewed: the trainer still stepping has a full
    // batch_timeout.
    CHECK(second->ExpireBatches(kT0 + absl::Minutes(10) + absl::Seconds(29)) ==
          0);
    auto published = Publish(*second, 1, batch.batch_id());
    REQUIRE(published.ok());
    CHECK_FALSE(published->duplicate);
    CHECK(published->commit.groups == 2);
    CHECK(second->Stats().groups_trained == 2);
    CHECK(second->Stats().ready_groups == 1);
  }

  SECTION("killed after recording the publish, before answering") {
    REQUIRE(Publish(*first, 1, batch.batch_id()).ok());
    first.reset();
    auto second = Recovered(dir.path(), "b");
    CHECK(second->policy_version() == 1);
    auto retry = Publish(*second, 1, batch.batch_id());
    REQUIRE(retry.ok());
    CHECK(retry->duplicate);
    CHECK(second->Stats().groups_trained == 2);
    // Still a duplicate after a compaction and one more restart.
    REQUIRE(second->MaybeCompactJournal(1).ok());
    second.reset();
    auto third = Recovered(dir.path(), "c");
    auto again = Publish(*third, 1, batch.batch_id());
    REQUIRE(again.ok());
    CHECK(again->duplicate);
    const LedgerStats stats = third->Stats();
    CHECK(stats.policy_version == 1);
    CHECK(stats.groups_trained == 2);
    CHECK(stats.ready_groups == 1);
    CHECK(stats.training_groups == 0);
  }
}

TEST_CASE(
    "Publish: a dead trainer's batch returns at once, and its late publish "
    "commits only while no one else holds its groups",
    "[coordinator][publish]") {
  auto ledger = NewLedger();
  const std::vector<std::string> ids = ReadyGroups(*ledger, 2, 0);
  auto batch = Pull(*ledger, "t1", 0);
  REQUIRE(batch.groups_size() == 2);
  // Batches of live holders stay.
  CHECK(ledger->ReleaseBatches([](const std::string&) { return false; }) == 0);
  CHECK(ledger->ReleaseBatches(
            [](const std::string& id) { return id == "t1"; }) == 1);
  LedgerStats stats = ledger->Stats();
  CHECK(stats.training_groups == 0);
  CHECK(stats.ready_groups == 2);
  CHECK(stats.batches_released == 1);
  CHECK(stats.batches_expired == 0);

  SECTION("the trainer was alive after all: its publish still commits") {
    auto late = Publish(*ledger, 1, batch.batch_id());
    REQUIRE(late.ok());
    CHECK(late->commit.groups == 2);
    CHECK(ledger->Stats().ready_groups == 0);
  }
  SECTION("another trainer took the groups: the late publish is refused") {
    auto taken = Pull(*ledger, "t2", 0);
    CHECK(GroupIds(taken) == ids);
    auto late = Publish(*ledger, 1, batch.batch_id());
    CHECK(absl::IsFailedPrecondition(late.status()));
    CHECK(ledger->policy_version() == 0);
    REQUIRE(Publish(*ledger, 1, taken.batch_id()).ok());
    CHECK(ledger->Stats().groups_trained == 2);
  }
}

TEST_CASE(
    "Resume: groups trained after the trainer's checkpoint are trained "
    "again within max_lag and counted lost beyond it",
    "[coordinator][publish][journal]") {
  TempDir dir;
  auto ledger = Recovered(dir.path(), "a");
  // Versions 1..5 each train one group generated at the version before
  // (max_lag 2).
  std::vector<std::string> trained;
  std::string last_batch;
  for (uint64_t v = 1; v <= 5; ++v) {
    trained.push_back(ReadyGroups(*ledger, 1, v - 1)[0]);
    auto batch = Pull(*ledger, "t1", v - 1);
    REQUIRE(GroupIds(batch) == std::vector<std::string>{trained.back()});
    REQUIRE(Publish(*ledger, v, batch.batch_id()).ok());
    last_batch = batch.batch_id();
  }
  // t1 dies holding a batch; t2 resumes from the checkpoint at version 1.
  const std::string held = ReadyGroups(*ledger, 1, 4)[0];
  REQUIRE(Pull(*ledger, "t1", 5).groups_size() == 1);

  auto resumed = ledger->Resume("t2", 1);
  REQUIRE(resumed.ok());
  CHECK(resumed->policy_version == 5);
  CHECK(resumed->batches_released == 1);
  // Versions 2..5 are gone from the weights. Their groups were generated
  // at 1..4: at version 5 (max_lag 2) those of 3 and 4 can be trained
  // again; the one of version 2 is too stale, and version 2's own data is
  // no longer held (only the newest max_lag + 1 versions are): both lost.
  CHECK(resumed->groups_requeued == 2);
  CHECK(resumed->groups_lost == 2);
  CHECK(resumed->complete);
  const LedgerStats stats = ledger->Stats();
  CHECK(stats.groups_requeued == 2);
  CHECK(stats.groups_lost == 2);
  CHECK(stats.groups_trained == 5);
  CHECK(stats.ready_groups == 3);
  CHECK(stats.training_groups == 0);

  // Requeued groups come first (in their order), then the released batch.
  auto again = Pull(*ledger, "t2", 5);
  CHECK(GroupIds(again) ==
        std::vector<std::string>{trained[3], trained[4], held});
  // The duplicate check no longer matches a version the trainer forgot.
  auto stale = Publish(*ledger, 5, last_batch);
  CHECK(absl::IsFailedPrecondition(stale.status()));
  REQUIRE(Publish(*ledger, 6, again.batch_id()).ok());
  CHECK(ledger->Stats().groups_trained == 8);

  // The journal replays to the same counts, also after a compaction.
  const LedgerStats before = ledger->Stats();
  ledger.reset();
  auto second = Recovered(dir.path(), "b");
  const LedgerStats after = second->Stats();
  CHECK(after.policy_version == before.policy_version);
  CHECK(after.groups_trained == before.groups_trained);
  CHECK(after.groups_requeued == 2);
  CHECK(after.groups_lost == 2);
  CHECK(after.batches_released == 1);
  CHECK(after.ready_groups == 0);
  // A second resume from the same old checkpoint rewinds only version 6
  // (versions 2..5 were accounted for already); of its groups (generated
  // at 3, 4, 4) the one of version 3 is now too stale.
  auto twice = second->Resume("t3", 1);
  REQUIRE(twice.ok());
  CHECK(twice->policy_version == 6);
  CHECK(twice->groups_requeued == 2);
  CHECK(twice->groups_lost == 1);
  REQUIRE(second->MaybeCompactJournal(1).ok());
  second.reset();
  auto third = Recovered(dir.path(), "c");
  CHECK(third->Stats().groups_requeued == 4);
  CHECK(third->Stats().groups_lost == 3);
  CHECK(third->Stats().ready_groups == 2);
}

TEST_CASE(
    "Release: a batch its trainer hands back is ready again at once, behind "
    "the waiting groups, only for its holder, and stays released after a "
    "restart",
    "[coordinator][publish][journal]") {
  TempDir dir;
  auto ledger = Recovered(dir.path(), "a");
  const std::vector<std::string> ids = ReadyGroups(*ledger, 3, 0);
  auto batch = Pull(*ledger, "t1", 0, 2);
  REQUIRE(batch.groups_size() == 2);
  CHECK(absl::IsNotFound(ledger->ReleaseBatch("t1", "no-such-batch").status()));
  CHECK(absl::IsPermissionDenied(
      ledger->ReleaseBatch("t2", batch.batch_id()).status()));
  CHECK(ledger->Stats().training_groups == 2);
  auto released = ledger->ReleaseBatch("t1", batch.batch_id());
  REQUIRE(released.ok());
  CHECK(*released == 2);
  // Long before batch_timeout (30 s): nothing waits for the deadline.
  LedgerStats stats = ledger->Stats();
  CHECK(stats.training_groups == 0);
  CHECK(stats.ready_groups == 3);
  CHECK(stats.batches_released == 1);
  CHECK(stats.batches_expired == 0);
  // Handing it back twice finds nothing.
  CHECK(
      absl::IsNotFound(ledger->ReleaseBatch("t1", batch.batch_id()).status()));
  // The journal keeps the release: a restarted coordinator has the groups
  // ready, in the same order (the handed-back ones behind the group that
  // waited, so a batch whose step fails again is not the next one pulled).
  ledger.reset();
  auto second = Recovered(dir.path(), "b");
  stats = second->Stats();
  CHECK(stats.training_groups == 0);
  CHECK(stats.ready_groups == 3);
  CHECK(stats.batches_released == 1);
  auto again = Pull(*second, "t1", 0);
  CHECK(GroupIds(again) == std::vector<std::string>{ids[2], ids[0], ids[1]});
}

TEST_CASE("Resume: a trainer at the latest version loses nothing",
          "[coordinator][publish]") {
  auto ledger = NewLedger();
  ReadyGroups(*ledger, 1, 0);
  const std::string batch_id = Pull(*ledger, "t", 0).batch_id();
  REQUIRE(Publish(*ledger, 1, batch_id).ok());
  auto resumed = ledger->Resume("t", 1);
  REQUIRE(resumed.ok());
  CHECK(resumed->policy_version == 1);
  CHECK(resumed->groups_requeued == 0);
  CHECK(resumed->groups_lost == 0);
  CHECK(resumed->batches_released == 0);
  // Duplicates of the latest publish are still recognized.
  auto again = Publish(*ledger, 1, batch_id);
  REQUIRE(again.ok());
  CHECK(again->duplicate);
}

}  // namespace
}  // namespace tandem::coordinator
