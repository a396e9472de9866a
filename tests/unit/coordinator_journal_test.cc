#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
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
            ("tandem_journal_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter_++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

journal::Record Skip(uint64_t n) {
  journal::Record record;
  record.mutable_source_skipped()->set_prompts(n);
  return record;
}

std::vector<uint64_t> ReplayAll(Journal& journal, uint64_t* dropped) {
  std::vector<uint64_t> seen;
  REQUIRE(journal
              .Replay(
                  [&](const journal::Record& r) {
                    seen.push_back(r.source_skipped().prompts());
                    return absl::OkStatus();
                  },
                  dropped)
              .ok());
  return seen;
}

TEST_CASE("Journal: records survive reopening; a torn tail is cut off",
          "[coordinator][journal]") {
  TempDir dir;
  {
    auto journal = Journal::Open(dir.path());
    REQUIRE(journal.ok());
    for (uint64_t i = 1; i <= 3; ++i) (*journal)->Append(Skip(i));
    REQUIRE((*journal)->Sync().ok());
    CHECK((*journal)->syncs() == 1);
  }
  const std::string path = dir.path() + "/journal";
  {
    // A crash in the middle of writing a record.
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << std::string("\x20\x00\x00\x00\x01\x02", 6);
  }
  auto journal = Journal::Open(dir.path());
  REQUIRE(journal.ok());
  uint64_t dropped = 0;
  CHECK(ReplayAll(**journal, &dropped) == std::vector<uint64_t>{1, 2, 3});
  CHECK(dropped == 6);
  (*journal)->Append(Skip(4));
  REQUIRE((*journal)->Sync().ok());
  {
    // A flipped byte inside the last record fails its CRC.
    const auto size = std::filesystem::file_size(path);
    int fd = ::open(path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    char byte = 0x7f;
    REQUIRE(::pwrite(fd, &byte, 1, static_cast<off_t>(size - 1)) == 1);
    ::close(fd);
  }
  auto reopened = Journal::Open(dir.path());
  REQUIRE(reopened.ok());
  CHECK(ReplayAll(**reopened, &dropped) == std::vector<uint64_t>{1, 2, 3});
  CHECK(dropped > 0);
  REQUIRE((*reopened)->Rewrite({Skip(9)}).ok());
  auto compacted = Journal::Open(dir.path());
  REQUIRE(compacted.ok());
  CHECK(ReplayAll(**compacted, &dropped) == std::vector<uint64_t>{9});
  CHECK(dropped == 0);
}

GroupLedgerOptions Options() {
  GroupLedgerOptions options;
  options.group_size = 2;
  options.max_lag = 3;
  options.lease_timeout = absl::Seconds(10);
  options.batch_timeout = absl::Seconds(30);
  options.groups_per_version = 100;
  return options;
}

// A ledger recovered from `dir` (incarnation `prefix`).
std::unique_ptr<GroupLedger> Recovered(const std::string& dir,
                                       const std::string& prefix,
                                       absl::Time now,
                                       std::vector<ScoringTask>* to_score) {
  GroupLedgerOptions options = Options();
  options.id_prefix = prefix;
  auto ledger = std::make_unique<GroupLedger>(
      options, std::make_unique<CountingPromptSource>(0));
  auto journal = Journal::Open(dir);
  REQUIRE(journal.ok());
  REQUIRE(ledger->Recover(std::move(journal).value(), now, to_score).ok());
  return ledger;
}

void Submit(GroupLedger& ledger, const tandem::v1::PromptLease& lease,
            uint32_t index, uint64_t version, bool score) {
  tandem::v1::SubmitSamplesRequest request;
  request.set_member_id("w");
  *request.add_samples() =
      MakeSample(lease.lease_id(), lease.group_id(), index, version);
  auto result = ledger.Submit(request);
  REQUIRE(result.ok());
  REQUIRE(result->response.accepted() == 1);
  if (score) {
    ledger.RecordScore(lease.group_id(), index, MakeScore(index % 2));
  }
}

void CheckSameState(const LedgerStats& a, const LedgerStats& b) {
  CHECK(a.policy_version == b.policy_version);
  CHECK(a.pending_prompts == b.pending_prompts);
  CHECK(a.leased_prompts == b.leased_prompts);
  CHECK(a.scoring_samples == b.scoring_samples);
  CHECK(a.ready_groups == b.ready_groups);
  CHECK(a.training_groups == b.training_groups);
  CHECK(a.groups_dispatched == b.groups_dispatched);
  CHECK(a.groups_completed == b.groups_completed);
  CHECK(a.groups_trained == b.groups_trained);
  CHECK(a.groups_dropped_stale == b.groups_dropped_stale);
  CHECK(a.samples_received == b.samples_received);
  CHECK(a.lease_expiries == b.lease_expiries);
  CHECK(a.dataset_cursor == b.dataset_cursor);
}

TEST_CASE("Ledger recovered from its journal continues where it stopped",
          "[coordinator][journal]") {
  TempDir dir;
  std::vector<ScoringTask> to_score;
  auto first = Recovered(dir.path(), "a", kT0, &to_score);
  CHECK(to_score.empty());
  auto leases = first->Lease("w", 7, 0, kT0);
  REQUIRE(leases.leases_size() == 7);
  auto lease = [&](int i) { return leases.leases(i); };
  // Groups 0-2 complete; 3 is half scored; 4 has one unscored sample;
  // 5 expires; 6 stays leased.
  for (int g = 0; g < 3; ++g) {
    Submit(*first, lease(g), 0, 0, true);
    Submit(*first, lease(g), 1, 0, true);
  }
  Submit(*first, lease(3), 0, 0, true);
  Submit(*first, lease(3), 1, 0, false);
  Submit(*first, lease(4), 0, 0, false);
  first->Renew("w", {lease(6).lease_id()}, kT0 + absl::Seconds(5));
  // Group 3's lease ended with its last sample; 4 and 5 expire, 6 was
  // renewed.
  REQUIRE(first->ExpireLeases(kT0 + absl::Seconds(11)) == 2);
  REQUIRE(first->PublishVersion(1).ok());
  tandem::v1::PullTrainingBatchRequest pull;
  pull.set_trainer_policy_version(1);
  pull.set_max_groups(1);
  auto trained = first->Pull(pull, kT0);
  REQUIRE(trained.groups_size() == 1);
  REQUIRE(first->Commit(trained.batch_id(), 2).ok());
  REQUIRE(first->PublishVersion(2).ok());
  auto open = first->Pull(pull, kT0);  // handed out, never committed
  REQUIRE(open.groups_size() == 1);
  const LedgerStats before = first->Stats();
  CHECK(before.ready_groups == 1);
  CHECK(before.training_groups == 1);
  REQUIRE(first->SyncJournal().ok());
  first.reset();

  to_score.clear();
  auto second = Recovered(dir.path(), "b", kT0 + absl::Minutes(1), &to_score);
  CheckSameState(before, second->Stats());
  // The unscored sample of group 3 goes to the verifiers again.
  REQUIRE(to_score.size() == 1);
  CHECK(to_score[0].group_id == lease(3).group_id());
  CHECK(to_score[0].sample_index == 1);
  CHECK(second->RecordScore(to_score[0].group_id, 1, MakeScore(1)));
  // The trainer's open batch still commits (it was not handed out again);
  // the committed one is gone for good.
  auto late = second->Commit(open.batch_id(), 3);
  REQUIRE(late.ok());
  CHECK(late->groups == 1);
  tandem::v1::PullTrainingBatchRequest rest;
  rest.set_trainer_policy_version(2);
  auto remaining = second->Pull(rest, kT0 + absl::Minutes(1));
  std::set<std::string> ids;
  for (const auto& g : remaining.groups()) ids.insert(g.group_id());
  CHECK(ids == std::set<std::string>{lease(2).group_id(), lease(3).group_id()});
  // Lease 6 is still out (with a fresh deadline) and samples for it count.
  CHECK(second->ExpireLeases(kT0 + absl::Minutes(1) + absl::Seconds(9)) == 0);
  Submit(*second, lease(6), 0, 2, true);
  // Expired prompts come back first, then the source continues after p6.
  auto next = second->Lease("v", 3, 2, kT0 + absl::Minutes(1));
  std::vector<std::string> prompt_ids;
  for (const auto& l : next.leases()) prompt_ids.push_back(l.prompt_id());
  CHECK(prompt_ids == std::vector<std::string>{"p4", "p5", "p7"});
  CHECK(next.leases(0).lease_id().rfind("b-", 0) == 0);
  const LedgerStats after = second->Stats();
  CHECK(after.groups_trained == 2);
  REQUIRE(second->MaybeCompactJournal(1).ok());
  second.reset();

  // A third incarnation after compaction sees the same again.
  to_score.clear();
  auto third = Recovered(dir.path(), "c", kT0 + absl::Minutes(2), &to_score);
  LedgerStats restored = third->Stats();
  CheckSameState(after, restored);
  CHECK(to_score.empty());
}


// A disk that blocks every fdatasync until released.
class StuckDisk {
 public:
  explicit StuckDisk(Journal* journal) : journal_(journal) {
    journal->set_before_sync([this] {
      entered_.fetch_add(1);
      release_.WaitForNotification();
    });
  }
  ~StuckDisk() {
    Release();
    journal_->set_before_sync(nullptr);
  }
  // Waits until a sync is blocked on this disk.
  void WaitForSync() const {
    while (entered_.load() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  Journal* journal_;
  std::atomic<int> entered_{0};
  absl::Notification release_;
};

// Runs `f` on another thread; true if it returns while `disk` is stuck,
// within a (generous) time. A call that waits for the disk never does: the
// disk is then released and the test fails instead of hanging.
template <typename F>
bool ReturnsWhileDiskIsStuck(StuckDisk& disk, F f) {
  auto done = std::async(std::launch::async, f);
  if (done.wait_for(std::chrono::seconds(20)) == std::future_status::ready) {
    return true;
  }
  disk.Release();
  return false;
}

TEST_CASE("Journal: a sync in progress lets appends go on; the callers "
          "queued behind it share one sync (group commit)",
          "[coordinator][journal]") {
  TempDir dir;
  auto opened = Journal::Open(dir.path());
  REQUIRE(opened.ok());
  Journal& journal = **opened;
  StuckDisk disk(&journal);
  const uint64_t first = journal.Append(Skip(1));
  auto syncing = std::async(std::launch::async,
                            [&] { return journal.SyncTo(first); });
  disk.WaitForSync();
  // Appends do not wait for the disk; their syncs queue behind the one in
  // progress.
  std::vector<std::future<absl::Status>> queued;
  for (uint64_t i = 2; i <= 5; ++i) {
    uint64_t position = 0;
    auto append = [&] { position = journal.Append(Skip(i)); };
    CHECK(ReturnsWhileDiskIsStuck(disk, append));
    queued.push_back(std::async(std::launch::async, [&journal, position] {
      return journal.SyncTo(position);
    }));
  }
  CHECK(journal.syncs() == 0);
  disk.Release();
  REQUIRE(syncing.get().ok());
  for (auto& q : queued) REQUIRE(q.get().ok());
  // One sync for record 1, one for 2-5 together.
  CHECK(journal.syncs() == 2);
  auto reopened = Journal::Open(dir.path());
  REQUIRE(reopened.ok());
  uint64_t dropped = 0;
  CHECK(ReplayAll(**reopened, &dropped) ==
        std::vector<uint64_t>{1, 2, 3, 4, 5});
}

TEST_CASE("Journal: records appended while a compaction writes its "
          "snapshot are kept after it",
          "[coordinator][journal]") {
  TempDir dir;
  auto opened = Journal::Open(dir.path());
  REQUIRE(opened.ok());
  Journal& journal = **opened;
  journal.Append(Skip(1));
  journal.Append(Skip(2));
  REQUIRE(journal.Sync().ok());
  // During the compaction's sync of its new file (the hook runs with no
  // lock held), another record arrives.
  bool appended = false;
  journal.set_before_sync([&] {
    if (!appended) journal.Append(Skip(3));
    appended = true;
  });
  REQUIRE(journal
              .Compact([&] {
                return Journal::Snapshot{{Skip(12)}, journal.appended()};
              })
              .ok());
  journal.set_before_sync(nullptr);
  REQUIRE(journal.Sync().ok());
  auto reopened = Journal::Open(dir.path());
  REQUIRE(reopened.ok());
  uint64_t dropped = 0;
  CHECK(ReplayAll(**reopened, &dropped) == std::vector<uint64_t>{12, 3});
}

TEST_CASE("Ledger: leases, submits and status go on while a publish, a "
          "commit or a hand-out waits for the disk",
          "[coordinator][journal]") {
  TempDir dir;
  std::vector<ScoringTask> to_score;
  auto ledger = Recovered(dir.path(), "a", kT0, &to_score);
  auto leases = ledger->Lease("w", 4, 0, kT0);
  REQUIRE(leases.leases_size() == 4);
  for (int g = 0; g < 2; ++g) {
    Submit(*ledger, leases.leases(g), 0, 0, true);
    Submit(*ledger, leases.leases(g), 1, 0, true);
  }
  StuckDisk disk(ledger->journal());
  SECTION("a batch handed out") {
    tandem::v1::PullTrainingBatchRequest pull;
    pull.set_max_groups(100);
    auto pulling = std::async(std::launch::async,
                              [&] { return ledger->Pull(pull, kT0); });
    disk.WaitForSync();
    auto lease_and_submit = [&] {
      Submit(*ledger, leases.leases(2), 0, 0, true);
      CHECK(ledger->Lease("v", 1, 0, kT0).leases_size() == 1);
      CHECK(ledger->Stats().training_groups == 2);
    };
    CHECK(ReturnsWhileDiskIsStuck(disk, lease_and_submit));
    disk.Release();
    CHECK(pulling.get().groups_size() == 2);
  }
  SECTION("a version published with its batch") {
    tandem::v1::PullTrainingBatchRequest pull;
    pull.set_max_groups(100);
    disk.Release();
    auto batch = ledger->Pull(pull, kT0);
    REQUIRE(batch.groups_size() == 2);
    StuckDisk again(ledger->journal());
    tandem::v1::WeightManifest manifest;
    manifest.set_policy_version(1);
    auto publishing = std::async(std::launch::async, [&] {
      return ledger->PublishTrainedVersion(manifest, "", batch.batch_id());
    });
    again.WaitForSync();
    auto lease_and_submit = [&] {
      Submit(*ledger, leases.leases(2), 0, 1, true);
      CHECK(ledger->Lease("v", 1, 1, kT0).leases_size() == 1);
    };
    CHECK(ReturnsWhileDiskIsStuck(again, lease_and_submit));
    again.Release();
    auto published = publishing.get();
    REQUIRE(published.ok());
    CHECK(published->commit.groups == 2);
  }
}

}  // namespace
}  // namespace tandem::coordinator
