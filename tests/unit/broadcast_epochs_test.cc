#include "services/coordinator/broadcast_epochs.h"

#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tandem::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

tandem::v1::SyncWeightGroupRequest Report(const std::string& id,
                                          uint64_t version,
                                          uint64_t joined_epoch = 0,
                                          bool broadcast = true) {
  tandem::v1::SyncWeightGroupRequest r;
  r.set_member_id(id);
  r.set_policy_version(version);
  r.set_joined_epoch(joined_epoch);
  r.set_broadcast(broadcast);
  return r;
}

std::vector<std::string> Members(const tandem::v1::BroadcastGroup& g) {
  return {g.member_ids().begin(), g.member_ids().end()};
}

std::unique_ptr<BroadcastEpochs> NewWithTrainer() {
  BroadcastEpochsOptions options;
  options.key_prefix_base = "test";
  options.report_timeout = absl::Seconds(2);
  auto epochs = std::make_unique<BroadcastEpochs>(options);
  epochs->SetTrainer("t", "127.0.0.1:999");
  return epochs;
}

TEST_CASE("no trainer store, no group") {
  BroadcastEpochs epochs(BroadcastEpochsOptions{});
  epochs.Report(Report("w1", 0), kT0);
  CHECK(epochs.OnPublish(1, kT0).epoch() == 0);
}

TEST_CASE("caught-up workers form epoch 1 at the first publish, trainer "
          "rank 0") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w2", 0), kT0);
  epochs.Report(Report("w1", 0), kT0);
  tandem::v1::BroadcastGroup g = epochs.OnPublish(1, kT0);
  CHECK(g.epoch() == 1);
  CHECK(g.first_policy_version() == 1);
  CHECK(g.store_address() == "127.0.0.1:999");
  CHECK(g.key_prefix() == "test/epoch1");
  CHECK(Members(g) == std::vector<std::string>{"t", "w1", "w2"});
  CHECK(epochs.Stats().receivers == 2);
}

TEST_CASE("membership is stable between versions while nothing changes") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).epoch() == 1);
  // w1 joined; its reports may be older than the report timeout while it
  // is busy in collectives: it stays.
  epochs.Report(Report("w1", 1, 1), kT0 + absl::Seconds(1));
  tandem::v1::BroadcastGroup g = epochs.OnPublish(2, kT0 + absl::Seconds(9));
  CHECK(g.epoch() == 1);
  CHECK(g.first_policy_version() == 1);
  CHECK(epochs.Stats().epochs_formed == 1);
}

TEST_CASE("a lagging or silent worker does not join; it joins once caught "
          "up") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  epochs.Report(Report("lagging", 0), kT0);
  epochs.Report(Report("silent", 4), kT0 - absl::Seconds(3));
  epochs.Report(Report("puller", 4, 0, /*broadcast=*/false), kT0);
  // Version 5: caught up means holding version 4.
  tandem::v1::BroadcastGroup g = epochs.OnPublish(5, kT0);
  CHECK(Members(g) == std::vector<std::string>{"t"});
  epochs.Report(Report("w1", 5), kT0 + absl::Seconds(1));
  g = epochs.OnPublish(6, kT0 + absl::Seconds(1));
  CHECK(g.epoch() == 2);
  CHECK(g.first_policy_version() == 6);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1"});
}

TEST_CASE("a new worker waits until current members confirmed the epoch") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).epoch() == 1);
  epochs.Report(Report("w2", 1), kT0);
  // w1 has not confirmed epoch 1 yet: no new epoch.
  CHECK(epochs.OnPublish(2, kT0).epoch() == 1);
  epochs.Report(Report("w1", 2, 1), kT0);
  epochs.Report(Report("w2", 2), kT0);
  tandem::v1::BroadcastGroup g = epochs.OnPublish(3, kT0);
  CHECK(g.epoch() == 2);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1", "w2"});
  CHECK(g.key_prefix() != "test/epoch1");
}

TEST_CASE("a removed member leaves at the next publish, the others stay") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  epochs.Report(Report("w2", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).member_ids_size() == 3);
  epochs.RemoveMember("w2");
  CHECK(epochs.Current().member_ids_size() == 3);  // only at a version
  tandem::v1::BroadcastGroup g = epochs.OnPublish(2, kT0);
  CHECK(g.epoch() == 2);
  CHECK(g.first_policy_version() == 2);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1"});
}

TEST_CASE("after a failed epoch only members that reported since, outside "
          "any group, are in the next one") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  epochs.Report(Report("w2", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).epoch() == 1);
  epochs.Report(Report("w1", 1, 1), kT0 + absl::Milliseconds(100));
  epochs.Report(Report("w2", 1, 1), kT0 + absl::Milliseconds(100));
  // w2 is killed mid-broadcast; the trainer reports the failed collective.
  tandem::v1::SyncWeightGroupRequest failed;
  failed.set_member_id("t");
  failed.set_failed_epoch(1);
  epochs.Report(failed, kT0 + absl::Seconds(1));
  CHECK(epochs.Stats().failures_reported == 1);
  // w1 left the group and pulled the missed version; w2 is silent.
  epochs.Report(Report("w1", 2), kT0 + absl::Milliseconds(1100));
  tandem::v1::BroadcastGroup g =
      epochs.OnPublish(3, kT0 + absl::Milliseconds(1200));
  CHECK(g.epoch() == 2);
  CHECK(g.first_policy_version() == 3);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1"});
  // The restarted worker (new member id) catches up and joins later.
  epochs.Report(Report("w1", 3, 2), kT0 + absl::Seconds(2));
  epochs.Report(Report("w2b", 3), kT0 + absl::Seconds(2));
  g = epochs.OnPublish(4, kT0 + absl::Seconds(2));
  CHECK(g.epoch() == 3);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1", "w2b"});
}

TEST_CASE("a failure report for an old epoch changes nothing") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).epoch() == 1);
  epochs.Report(Report("w1", 1, 1), kT0);
  tandem::v1::SyncWeightGroupRequest old;
  old.set_member_id("t");
  old.set_failed_epoch(7);
  epochs.Report(old, kT0);
  CHECK(epochs.OnPublish(2, kT0).epoch() == 1);
}

TEST_CASE("a new trainer forms a new epoch; a removed trainer ends the "
          "group") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).epoch() == 1);
  epochs.Report(Report("w1", 1, 1), kT0);
  epochs.SetTrainer("t2", "127.0.0.1:1000");
  // Everyone rejoins from a fresh report outside any group.
  epochs.Report(Report("w1", 1), kT0);
  tandem::v1::BroadcastGroup g = epochs.OnPublish(2, kT0);
  CHECK(g.epoch() == 2);
  CHECK(Members(g) == std::vector<std::string>{"t2", "w1"});
  CHECK(g.store_address() == "127.0.0.1:1000");
  epochs.RemoveMember("t2");
  CHECK(epochs.OnPublish(3, kT0).epoch() == 0);
}

TEST_CASE("broadcast disabled never forms a group") {
  BroadcastEpochsOptions options;
  options.enabled = false;
  BroadcastEpochs epochs(options);
  epochs.SetTrainer("t", "127.0.0.1:999");
  epochs.Report(Report("w1", 0), kT0);
  CHECK(epochs.OnPublish(1, kT0).epoch() == 0);
}

}  // namespace
}  // namespace tandem::coordinator
