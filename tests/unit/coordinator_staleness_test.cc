// Property test of the staleness bound: over random schedules of policy
// versions, leases, completions (with tokens from several versions),
// scoring order, lease expiries and uncommitted batches, no trained group
// is older than max_lag versions for the trainer that trained it, and no
// group or prompt is trained twice.

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>

#include "coordinator_test_util.h"
#include "services/coordinator/group_ledger.h"

namespace tandem::coordinator {
namespace {

using testing::CountingPromptSource;
using testing::MakeScore;

struct Worker {
  std::string id;
  uint64_t version = 0;
  std::vector<tandem::v1::PromptLease> leases;
};

TEST_CASE(
    "Staleness bound holds for every trained group over random "
    "schedules",
    "[coordinator][staleness][property]") {
  // Totals over all seeds, to show the schedules exercise every path.
  uint64_t dropped = 0, expiries = 0, batches_expired = 0, trained = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    auto chance = [&rng](double p) {
      return std::uniform_real_distribution<double>(0, 1)(rng) < p;
    };
    auto pick = [&rng](uint64_t n) {
      return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
    };
    GroupLedgerOptions options;
    options.group_size = 1 + pick(4);
    options.max_lag = pick(4);
    options.lease_timeout = absl::Seconds(5);
    options.batch_timeout = absl::Seconds(7);
    options.groups_per_version = 1 + pick(6);
    options.id_prefix = "p";
    GroupLedger ledger(options, std::make_unique<CountingPromptSource>(0));

    absl::Time now = absl::FromUnixSeconds(1700000000);
    uint64_t version = 0;  // published == trainer's version
    std::vector<Worker> workers(3);
    for (int i = 0; i < 3; ++i) workers[i].id = "w" + std::to_string(i);
    std::vector<ScoringTask> unscored;
    struct Pulled {
      std::string batch_id;
      uint64_t trainer_version;
      std::vector<std::string> group_ids;
    };
    std::vector<Pulled> open_batches;
    std::set<std::string> trained_groups;
    std::set<std::string> trained_prompts;
    std::map<std::string, uint64_t> group_min_version;
    std::map<std::string, std::string> group_prompt;
    uint64_t checked = 0;

    for (int step = 0; step < 1500; ++step) {
      now += absl::Milliseconds(pick(400));
      Worker& worker = workers[pick(workers.size())];
      switch (pick(7)) {
        case 0: {  // a worker catches up on weights (maybe partially)
          if (worker.version < version) {
            worker.version += 1 + pick(version - worker.version);
          }
          break;
        }
        case 1: {  // lease
          auto response =
              ledger.Lease(worker.id, 1 + pick(3), worker.version, now);
          for (const auto& lease : response.leases()) {
            worker.leases.push_back(lease);
          }
          break;
        }
        case 2: {  // finish one lease: tokens from worker.version onwards
          if (worker.leases.empty()) break;
          const size_t i = pick(worker.leases.size());
          tandem::v1::PromptLease lease = worker.leases[i];
          worker.leases.erase(worker.leases.begin() + i);
          tandem::v1::SubmitSamplesRequest request;
          for (uint32_t s = 0; s < lease.group_size(); ++s) {
            tandem::v1::Sample sample = testing::MakeSample(
                lease.lease_id(), lease.group_id(), s, worker.version, 3);
            if (chance(0.3) && worker.version < version) {
              // An inflight weight update in the middle of the sample.
              sample.mutable_version_spans(0)->set_num_tokens(1);
              auto* span = sample.add_version_spans();
              span->set_policy_version(worker.version + 1);
              span->set_num_tokens(2);
            }
            *request.add_samples() = sample;
          }
          request.set_member_id(worker.id);
          auto result = ledger.Submit(request);
          REQUIRE(result.ok());
          for (auto& task : result->to_score) unscored.push_back(task);
          group_prompt[lease.group_id()] = lease.prompt_id();
          group_min_version[lease.group_id()] = worker.version;
          break;
        }
        case 3: {  // verifiers score some samples, in any order
          for (int n = pick(6); n > 0 && !unscored.empty(); --n) {
            const size_t i = pick(unscored.size());
            ledger.RecordScore(unscored[i].group_id, unscored[i].sample_index,
                               MakeScore(static_cast<double>(pick(2))));
            unscored.erase(unscored.begin() + i);
          }
          break;
        }
        case 4: {  // the trainer pulls
          tandem::v1::PullTrainingBatchRequest request;
          request.set_trainer_policy_version(version);
          request.set_max_groups(pick(4));
          request.set_max_tokens(pick(2) ? 0 : 10 + pick(60));
          auto batch = ledger.Pull(request, now);
          for (const auto& group : batch.groups()) {
            REQUIRE(group.min_policy_version() ==
                    group_min_version[group.group_id()]);
            REQUIRE(version - group.min_policy_version() <= options.max_lag);
            ++checked;
          }
          if (!batch.batch_id().empty()) {
            Pulled pulled{batch.batch_id(), version, {}};
            for (const auto& group : batch.groups()) {
              pulled.group_ids.push_back(group.group_id());
            }
            open_batches.push_back(std::move(pulled));
          }
          break;
        }
        case 5: {  // the trainer commits (or crashed and never will)
          if (open_batches.empty()) break;
          const Pulled pulled = open_batches.front();
          open_batches.erase(open_batches.begin());
          if (chance(0.15)) break;  // abandoned: expires and is re-pulled
          auto committed = ledger.Commit(pulled.batch_id, version + 1);
          if (!committed.ok()) break;  // expired and handed out again
          for (uint64_t staleness : committed->staleness) {
            REQUIRE(staleness <= options.max_lag);
          }
          for (const std::string& id : pulled.group_ids) {
            REQUIRE(trained_groups.insert(id).second);
            REQUIRE(trained_prompts.insert(group_prompt[id]).second);
          }
          if (pulled.trainer_version == version && chance(0.7)) {
            REQUIRE(ledger.PublishVersion(version + 1).ok());
            ++version;
          }
          break;
        }
        case 6: {  // time-outs and a worker dying now and then
          ledger.ExpireLeases(now);
          ledger.ExpireBatches(now);
          if (chance(0.05)) {
            ledger.ReleaseMember(worker.id);
            worker.leases.clear();
            worker.version = version;
          }
          break;
        }
      }
      // Now and then workers renew their leases and forget those the
      // coordinator no longer knows.
      for (Worker& w : workers) {
        if (!chance(0.1)) continue;
        std::vector<std::string> ids;
        for (const auto& lease : w.leases) ids.push_back(lease.lease_id());
        if (ids.empty()) continue;
        RenewResult renewed = ledger.Renew(w.id, ids, now);
        std::set<std::string> unknown(renewed.unknown.begin(),
                                      renewed.unknown.end());
        std::erase_if(w.leases, [&](const tandem::v1::PromptLease& lease) {
          return unknown.count(lease.lease_id()) > 0;
        });
      }
    }
    LedgerStats stats = ledger.Stats();
    CHECK(stats.groups_trained <= stats.groups_completed);
    CHECK(stats.groups_completed <= stats.groups_dispatched);
    CHECK(checked > 0);
    CHECK(trained_groups.size() == stats.groups_trained);
    dropped += stats.groups_dropped_stale;
    expiries += stats.lease_expiries;
    batches_expired += stats.batches_expired;
    trained += stats.groups_trained;
  }
  CHECK(dropped > 0);
  CHECK(expiries > 0);
  CHECK(batches_expired > 0);
  CHECK(trained > 1000);
}

}  // namespace
}  // namespace tandem::coordinator
