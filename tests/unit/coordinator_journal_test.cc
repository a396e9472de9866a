#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

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

}  // namespace
}  // namespace tandem::coordinator
