// Multi-turn episodes in the coordinator's ledger (episode_rules.h): a
// lease of a dataset row that names an environment carries the
// environment, verifier and metadata (a single-turn lease none of them);
// the environment's reward is the sample's score, with no verifier call;
// an episode without a reward scores 0 with its end reason as outcome; a
// sample of an episode lease without an end reason is refused; and a
// coordinator recovered from its journal gives the same rewards, also when
// the Score record after the sample was torn off by the crash.

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator_test_util.h"
#include "services/coordinator/group_ledger.h"
#include "services/coordinator/journal.h"

namespace tandem::coordinator {
namespace {

using testing::MakeSample;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// Prompts "e0", "e1", ... of the calculator environment; every third one
// ("s2", "s5", ...) single-turn.
class EpisodePromptSource : public PromptSource {
 public:
  EpisodePromptSource() = default;
  // Every episode prompt with this reward_range.
  explicit EpisodePromptSource(environment::RewardRange range)
      : range_(range) {}
  std::optional<Prompt> Next() override {
    Prompt prompt;
    const bool single = cursor_ % 3 == 2;
    prompt.id = absl::StrCat(single ? "s" : "e", cursor_++);
    prompt.text = "What is 3 * 4?";
    prompt.token_ids = {1, 2, 3};
    prompt.verifier = "exact";
    prompt.metadata["answer"] = "12";
    if (!single) {
      prompt.environment = "calculator";
      prompt.reward_range = range_;
    }
    return prompt;
  }
  uint64_t cursor() const override { return cursor_; }
  std::string Describe() const override { return "episodes"; }

 private:
  uint64_t cursor_ = 0;
  environment::RewardRange range_;
};

GroupLedgerOptions Options() {
  GroupLedgerOptions options;
  options.group_size = 2;
  options.max_lag = 3;
  options.groups_per_version = 100;
  return options;
}

tandem::v1::Sample Episode(const tandem::v1::PromptLease& lease, uint32_t index,
                           std::optional<double> reward,
                           const std::string& end_reason) {
  tandem::v1::Sample sample =
      MakeSample(lease.lease_id(), lease.group_id(), index, 0, 3);
  auto* model = sample.add_source_spans();
  model->set_source(tandem::v1::TOKEN_SOURCE_MODEL);
  model->set_num_tokens(2);
  auto* env = sample.add_source_spans();
  env->set_source(tandem::v1::TOKEN_SOURCE_ENVIRONMENT);
  env->set_num_tokens(1);
  if (reward) sample.set_environment_reward(*reward);
  sample.set_episode_end_reason(end_reason);
  sample.set_episode_end_text("scored by exact");
  return sample;
}

absl::StatusOr<SubmitResult> SubmitOne(GroupLedger& ledger,
                                       const tandem::v1::Sample& sample) {
  tandem::v1::SubmitSamplesRequest request;
  request.set_member_id("w");
  *request.add_samples() = sample;
  return ledger.Submit(request);
}

// reward and outcome of every sample of every ready group, by sample id.
std::map<std::string, std::pair<double, std::string>> ReadyScores(
    GroupLedger& ledger) {
  tandem::v1::PullTrainingBatchRequest pull;
  pull.set_max_tokens(1 << 20);
  const tandem::v1::PullTrainingBatchResponse batch = ledger.Pull(pull, kT0);
  std::map<std::string, std::pair<double, std::string>> scores;
  for (const auto& group : batch.groups()) {
    for (const auto& s : group.samples()) {
      scores[s.sample().sample_id()] = {s.score().reward(),
                                        s.score().outcome()};
    }
  }
  return scores;
}

TEST_CASE(
    "an episode lease names its environment and scorer; a single-turn "
    "lease keeps them at the coordinator",
    "[coordinator][episodes]") {
  GroupLedger ledger(Options(), std::make_unique<EpisodePromptSource>());
  const auto leases = ledger.Lease("w", 3, 0, kT0);
  REQUIRE(leases.leases_size() == 3);
  const tandem::v1::PromptLease& episode = leases.leases(0);
  CHECK(episode.environment() == "calculator");
  CHECK(episode.verifier() == "exact");
  CHECK(episode.metadata().at("answer") == "12");
  const tandem::v1::PromptLease& single = leases.leases(2);
  CHECK(single.prompt_id() == "s2");
  CHECK(single.environment().empty());
  CHECK(single.verifier().empty());
  CHECK(single.metadata().empty());
}

TEST_CASE(
    "the environment's reward is the score without a verifier call; "
    "no reward scores 0 with the end reason",
    "[coordinator][episodes]") {
  GroupLedger ledger(Options(), std::make_unique<EpisodePromptSource>());
  const auto leases = ledger.Lease("w", 3, 0, kT0);
  const tandem::v1::PromptLease& lease = leases.leases(0);

  // An episode lease's sample must say why it ended.
  absl::StatusOr<SubmitResult> missing =
      SubmitOne(ledger, Episode(lease, 0, 1.0, ""));
  REQUIRE(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("samples[0].episode_end_reason is empty"));
  CHECK(ledger.Stats().samples_received == 0);

  auto first = SubmitOne(ledger, Episode(lease, 0, 1.0, "answered"));
  REQUIRE(first.ok());
  CHECK(first->to_score.empty());  // no verifier call
  auto second =
      SubmitOne(ledger, Episode(lease, 1, std::nullopt, "turn_limit"));
  REQUIRE(second.ok());
  CHECK(second->to_score.empty());
  CHECK(ledger.Stats().scoring_samples == 0);
  CHECK(ledger.Stats().ready_groups == 1);

  // The single-turn lease's samples still go to the verifier.
  const tandem::v1::PromptLease& single = leases.leases(2);
  auto scored =
      SubmitOne(ledger, MakeSample(single.lease_id(), single.group_id(), 0, 0));
  REQUIRE(scored.ok());
  CHECK(scored->to_score.size() == 1);

  const auto scores = ReadyScores(ledger);
  REQUIRE(scores.size() == 2);
  CHECK(scores.at(lease.lease_id() + "/0") ==
        std::make_pair(1.0, std::string("answered")));
  CHECK(scores.at(lease.lease_id() + "/1") ==
        std::make_pair(0.0, std::string("turn_limit")));
}

TEST_CASE(
    "a recovered coordinator gives an episode the same reward, also "
    "when its Score record was torn off",
    "[coordinator][episodes][journal]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("tandem_episodes_", ::getpid());
  std::filesystem::remove_all(dir);
  std::string lease_id;
  {
    GroupLedger ledger(Options(), std::make_unique<EpisodePromptSource>());
    auto journal = Journal::Open(dir.string());
    REQUIRE(journal.ok());
    std::vector<ScoringTask> none;
    REQUIRE(ledger.Recover(*std::move(journal), kT0, &none).ok());
    const auto leases = ledger.Lease("w", 1, 0, kT0);
    const tandem::v1::PromptLease& lease = leases.leases(0);
    lease_id = lease.lease_id();
    REQUIRE(SubmitOne(ledger, Episode(lease, 0, 0.25, "answered")).ok());
    REQUIRE(SubmitOne(ledger, Episode(lease, 1, 1.0, "environment")).ok());
    REQUIRE(ledger.SyncJournal().ok());
  }
  // The crash tore the last record: the Score record of sample 1, written
  // after its Sample record.
  const std::filesystem::path file = dir / "journal";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);

  GroupLedger recovered(Options(), std::make_unique<EpisodePromptSource>());
  auto journal = Journal::Open(dir.string());
  REQUIRE(journal.ok());
  std::vector<ScoringTask> to_score;
  REQUIRE(recovered.Recover(*std::move(journal), kT0, &to_score).ok());
  CHECK(to_score.empty());  // nothing for a verifier
  const auto scores = ReadyScores(recovered);
  REQUIRE(scores.size() == 2);
  CHECK(scores.at(lease_id + "/0") ==
        std::make_pair(0.25, std::string("answered")));
  CHECK(scores.at(lease_id + "/1") ==
        std::make_pair(1.0, std::string("environment")));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "a row's reward_range travels with the lease, bounds the episode "
    "rewards the coordinator takes, and survives recovery",
    "[coordinator][episodes][journal]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("tandem_reward_range_", ::getpid());
  std::filesystem::remove_all(dir);
  const environment::RewardRange penalties{-1.0, 1.0};
  std::string lease_id, group_id;
  {
    GroupLedger ledger(Options(),
                       std::make_unique<EpisodePromptSource>(penalties));
    auto journal = Journal::Open(dir.string());
    REQUIRE(journal.ok());
    std::vector<ScoringTask> none;
    REQUIRE(ledger.Recover(*std::move(journal), kT0, &none).ok());
    const auto leases = ledger.Lease("w", 3, 0, kT0);
    const tandem::v1::PromptLease& lease = leases.leases(0);
    lease_id = lease.lease_id();
    group_id = lease.group_id();
    REQUIRE(lease.has_reward_range());
    CHECK(lease.reward_range().min() == -1.0);
    CHECK(lease.reward_range().max() == 1.0);
    CHECK_FALSE(leases.leases(2).has_reward_range());  // single-turn

    absl::StatusOr<SubmitResult> over =
        SubmitOne(ledger, Episode(lease, 0, 1.5, "answered"));
    REQUIRE(over.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(over.status().message()),
               Catch::Contains("samples[0].environment_reward is 1.5; lease '" +
                               lease_id + "' takes rewards in [-1, 1]"));
    REQUIRE(SubmitOne(ledger, Episode(lease, 0, -0.5, "environment")).ok());
    REQUIRE(ledger.SyncJournal().ok());
  }
  // Recovered from the journal, the group keeps its range: a penalty is
  // still taken.
  GroupLedger recovered(Options(),
                        std::make_unique<EpisodePromptSource>(penalties));
  auto journal = Journal::Open(dir.string());
  REQUIRE(journal.ok());
  std::vector<ScoringTask> to_score;
  REQUIRE(recovered.Recover(*std::move(journal), kT0, &to_score).ok());
  tandem::v1::PromptLease same;
  same.set_lease_id(lease_id);
  same.set_group_id(group_id);
  REQUIRE(SubmitOne(recovered, Episode(same, 1, -1.0, "environment")).ok());
  const auto scores = ReadyScores(recovered);
  REQUIRE(scores.size() == 2);
  CHECK(scores.at(lease_id + "/0").first == -0.5);
  CHECK(scores.at(lease_id + "/1").first == -1.0);
  std::filesystem::remove_all(dir);

  // Without a reward_range a row takes [0, 1].
  GroupLedger plain(Options(), std::make_unique<EpisodePromptSource>());
  const auto leases = plain.Lease("w", 1, 0, kT0);
  absl::StatusOr<SubmitResult> penalty =
      SubmitOne(plain, Episode(leases.leases(0), 0, -0.5, "environment"));
  REQUIRE(penalty.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(penalty.status().message()),
             Catch::Contains("takes rewards in [0, 1]"));
}

// The prompt ids of a lease response, in order.
std::vector<std::string> PromptIds(const tandem::v1::LeasePromptsResponse& r) {
  std::vector<std::string> ids;
  for (const auto& lease : r.leases()) ids.push_back(lease.prompt_id());
  return ids;
}

TEST_CASE(
    "a lease that excludes an environment skips its tasks: they stay "
    "queued in order, first in line for the next lease, also after "
    "recovery, and no task is leased twice",
    "[coordinator][episodes][journal]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("tandem_excluded_", ::getpid());
  std::filesystem::remove_all(dir);
  const std::vector<std::string> calculator = {"calculator"};
  std::vector<std::string> leased;  // prompt ids, every lease
  auto note = [&](const tandem::v1::LeasePromptsResponse& r) {
    for (const std::string& id : PromptIds(r)) leased.push_back(id);
    return PromptIds(r);
  };
  // The source: e0 e1 s2 e3 e4 s5 e6 e7 s8 e9 ... (e: calculator tasks).
  {
    GroupLedger ledger(Options(), std::make_unique<EpisodePromptSource>());
    auto journal = Journal::Open(dir.string());
    REQUIRE(journal.ok());
    std::vector<ScoringTask> none;
    REQUIRE(ledger.Recover(*std::move(journal), kT0, &none).ok());

    const auto filtered = ledger.Lease("w", 2, 0, kT0, calculator);
    CHECK(note(filtered) == std::vector<std::string>{"s2", "s5"});
    CHECK(ledger.Stats().pending_prompts == 4);  // e0 e1 e3 e4
    // A lease that takes them gets them first, in order.
    CHECK(note(ledger.Lease("w", 3, 0, kT0)) ==
          std::vector<std::string>{"e0", "e1", "e3"});
    // Excluded again: e4 stays, e6 and e7 join it.
    CHECK(note(ledger.Lease("w", 1, 0, kT0, calculator)) ==
          std::vector<std::string>{"s8"});
    CHECK(ledger.Stats().pending_prompts == 3);

    // A filtered lease's samples are taken exactly once, as any lease's.
    const tandem::v1::PromptLease& lease = filtered.leases(0);
    tandem::v1::SubmitSamplesRequest request;
    request.set_member_id("w");
    for (uint32_t i = 0; i < 2; ++i) {
      *request.add_samples() =
          testing::MakeSample(lease.lease_id(), lease.group_id(), i, 0);
    }
    absl::StatusOr<SubmitResult> first = ledger.Submit(request);
    REQUIRE(first.ok());
    CHECK(first->response.accepted() == 2);
    absl::StatusOr<SubmitResult> again = ledger.Submit(request);
    REQUIRE(again.ok());
    CHECK(again->response.accepted() == 0);
    CHECK(again->response.duplicates() == 2);
    REQUIRE(ledger.SyncJournal().ok());
  }
  // Recovered from the journal: e4 e6 e7 wait first, then the source goes
  // on after s8.
  GroupLedger recovered(Options(), std::make_unique<EpisodePromptSource>());
  auto journal = Journal::Open(dir.string());
  REQUIRE(journal.ok());
  std::vector<ScoringTask> to_score;
  REQUIRE(recovered.Recover(*std::move(journal), kT0, &to_score).ok());
  CHECK(recovered.Stats().pending_prompts == 3);
  CHECK(note(recovered.Lease("w", 4, 0, kT0)) ==
        std::vector<std::string>{"e4", "e6", "e7", "e9"});
  std::vector<std::string> sorted = leased;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  CHECK(sorted.size() == 10);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "a filtered lease of a dataset of excluded tasks reads a bounded part "
    "of it",
    "[coordinator][episodes]") {
  class AllCalculator : public PromptSource {
   public:
    std::optional<Prompt> Next() override {
      Prompt prompt;
      prompt.id = absl::StrCat("e", cursor_++);
      prompt.token_ids = {1, 2, 3};
      prompt.environment = "calculator";
      return prompt;
    }
    uint64_t cursor() const override { return cursor_; }
    std::string Describe() const override { return "calculator only"; }

   private:
    uint64_t cursor_ = 0;
  };
  GroupLedger ledger(Options(), std::make_unique<AllCalculator>());
  const auto none = ledger.Lease("w", 4, 0, kT0, {"calculator"});
  CHECK(none.leases_size() == 0);
  CHECK_FALSE(none.exhausted());
  CHECK(none.retry_after_ms() > 0);
  CHECK(ledger.Stats().pending_prompts == kMaxSkippedPerLease);
  for (size_t i = 0; i < 2 * kMaxSkippedPending / kMaxSkippedPerLease; ++i) {
    ledger.Lease("w", 4, 0, kT0, {"calculator"});
  }
  CHECK(ledger.Stats().pending_prompts == kMaxSkippedPending);
  CHECK(PromptIds(ledger.Lease("w", 2, 0, kT0)) ==
        std::vector<std::string>{"e0", "e1"});
}

}  // namespace
}  // namespace tandem::coordinator
