#include "services/coordinator/broadcast_epochs.h"

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  options.regroup_wait = absl::Milliseconds(500);
  auto epochs = std::make_unique<BroadcastEpochs>(options);
  epochs->SetTrainer("t", "127.0.0.1:999");
  return epochs;
}

TEST_CASE("no trainer store, no group") {
  BroadcastEpochs epochs(BroadcastEpochsOptions{});
  epochs.Report(Report("w1", 0), kT0);
  CHECK(epochs.OnPublish(1, kT0).epoch() == 0);
}

TEST_CASE(
    "caught-up workers form epoch 1 at the first publish, trainer "
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

TEST_CASE(
    "a lagging or silent worker does not join; it joins once caught "
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

TEST_CASE(
    "after a failed epoch only members that reported since, outside "
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

TEST_CASE(
    "a new trainer forms a new epoch; a removed trainer ends the "
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

tandem::v1::SyncWeightGroupRequest Failed(const std::string& id, uint64_t epoch,
                                          uint64_t version) {
  tandem::v1::SyncWeightGroupRequest r;
  r.set_member_id(id);
  r.set_policy_version(version);
  r.set_failed_epoch(epoch);
  return r;
}

// Epoch 1 of t, w1, w2, w3 (every worker joined), versions 1..3 published.
std::unique_ptr<BroadcastEpochs> ThreeWorkersInEpoch1() {
  auto epochs = NewWithTrainer();
  for (const char* id : {"w1", "w2", "w3"}) epochs->Report(Report(id, 0), kT0);
  REQUIRE(epochs->OnPublish(1, kT0).member_ids_size() == 4);
  for (const char* id : {"w1", "w2", "w3"}) {
    epochs->Report(Report(id, 1, 1), kT0 + absl::Milliseconds(10));
  }
  REQUIRE(epochs->OnPublish(2, kT0 + absl::Milliseconds(20)).epoch() == 1);
  REQUIRE(epochs->OnPublish(3, kT0 + absl::Milliseconds(30)).epoch() == 1);
  return epochs;
}

TEST_CASE(
    "a failed broadcast is re-sent in epoch e+1 without the silent "
    "member, before the next publish, once regroup_wait passed") {
  auto owned = ThreeWorkersInEpoch1();
  BroadcastEpochs& epochs = *owned;
  const absl::Time failed = kT0 + absl::Seconds(1);
  // w3 was killed while version 2 was on the wire (3 was queued behind).
  epochs.Report(Failed("t", 1, 2), failed);
  CHECK_FALSE(epochs.Regroup(failed).has_value());
  // The survivors left the group; w1 holds 1, w2 pulled 3 meanwhile.
  epochs.Report(Report("w1", 1), failed + absl::Milliseconds(40));
  epochs.Report(Report("w2", 3), failed + absl::Milliseconds(60));
  // w3 never reports: the epoch waits for it until regroup_wait.
  CHECK_FALSE(epochs.Regroup(failed + absl::Milliseconds(499)).has_value());
  CHECK(epochs.Current().epoch() == 1);
  std::optional<tandem::v1::BroadcastGroup> g =
      epochs.Regroup(failed + absl::Milliseconds(500));
  REQUIRE(g.has_value());
  CHECK(g->epoch() == 2);
  CHECK(g->key_prefix() == "test/epoch2");
  // The latest published version, which epoch 1 did not deliver; w1 is in
  // although it holds only 1 (the re-send is full).
  CHECK(g->first_policy_version() == 3);
  CHECK(Members(*g) == std::vector<std::string>{"t", "w1", "w2"});
  CHECK(epochs.Current().epoch() == 2);
  CHECK(epochs.Stats().resend_epochs == 1);
  CHECK(epochs.Stats().epochs_formed == 2);
  // Formed once: no churn while its rendezvous is under way, also not at
  // the next publish before the members confirmed it.
  CHECK_FALSE(epochs.Regroup(failed + absl::Seconds(1)).has_value());
  epochs.Report(Report("w2b", 3), failed + absl::Seconds(1));
  CHECK(epochs.OnPublish(4, failed + absl::Seconds(1)).epoch() == 2);
  // Confirmed: the restarted worker (caught up) joins at a version.
  epochs.Report(Report("w1", 4, 2), failed + absl::Seconds(2));
  epochs.Report(Report("w2", 4, 2), failed + absl::Seconds(2));
  epochs.Report(Report("w2b", 4), failed + absl::Seconds(2));
  g = epochs.OnPublish(5, failed + absl::Seconds(2));
  CHECK(g->epoch() == 3);
  CHECK(Members(*g) == std::vector<std::string>{"t", "w1", "w2", "w2b"});
}

TEST_CASE(
    "the re-send epoch forms at once when every live member of the "
    "failed epoch reported leaving it") {
  auto owned = ThreeWorkersInEpoch1();
  BroadcastEpochs& epochs = *owned;
  const absl::Time failed = kT0 + absl::Seconds(1);
  epochs.Report(Failed("t", 1, 3), failed);
  epochs.RemoveMember("w3");  // expired: no longer waited for
  epochs.Report(Report("w1", 2), failed + absl::Milliseconds(30));
  CHECK_FALSE(epochs.Regroup(failed + absl::Milliseconds(30)).has_value());
  epochs.Report(Report("w2", 2), failed + absl::Milliseconds(50));
  std::optional<tandem::v1::BroadcastGroup> g =
      epochs.Regroup(failed + absl::Milliseconds(50));
  REQUIRE(g.has_value());
  CHECK(g->first_policy_version() == 3);
  CHECK(Members(*g) == std::vector<std::string>{"t", "w1", "w2"});
}

TEST_CASE(
    "the re-send epoch leaves out a member still in the failed epoch "
    "and admits only caught-up outsiders") {
  auto owned = ThreeWorkersInEpoch1();
  BroadcastEpochs& epochs = *owned;
  const absl::Time failed = kT0 + absl::Seconds(1);
  epochs.Report(Report("fresh", 2), failed - absl::Milliseconds(100));
  epochs.Report(Report("lagging", 1), failed - absl::Milliseconds(100));
  epochs.Report(Failed("t", 1, 3), failed);
  epochs.Report(Report("w1", 1), failed + absl::Milliseconds(50));
  // w2 has not noticed yet (still says it is in epoch 1); w3 is silent.
  epochs.Report(Report("w2", 1, 1), failed + absl::Milliseconds(50));
  std::optional<tandem::v1::BroadcastGroup> g =
      epochs.Regroup(failed + absl::Milliseconds(600));
  REQUIRE(g.has_value());
  CHECK(Members(*g) == std::vector<std::string>{"t", "fresh", "w1"});
}

TEST_CASE(
    "only the trainer's failure report triggers a re-send; a worker's "
    "waits for the next publish") {
  auto owned = ThreeWorkersInEpoch1();
  BroadcastEpochs& epochs = *owned;
  const absl::Time failed = kT0 + absl::Seconds(1);
  epochs.Report(Failed("w1", 1, 2), failed);
  epochs.Report(Report("w1", 3), failed + absl::Milliseconds(10));
  CHECK_FALSE(epochs.Regroup(failed + absl::Seconds(1)).has_value());
  CHECK(epochs.Current().epoch() == 1);
  tandem::v1::BroadcastGroup g = epochs.OnPublish(4, failed + absl::Seconds(1));
  CHECK(g.epoch() == 2);
  CHECK(g.first_policy_version() == 4);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1"});
}

TEST_CASE(
    "a publish before the regroup forms epoch e+1 itself; no second "
    "epoch follows") {
  auto owned = ThreeWorkersInEpoch1();
  BroadcastEpochs& epochs = *owned;
  const absl::Time failed = kT0 + absl::Seconds(1);
  epochs.Report(Failed("t", 1, 3), failed);
  // w1 pulled 3; w2 holds 1 but is a survivor: the trainer sends 4 in full.
  epochs.Report(Report("w1", 3), failed + absl::Milliseconds(20));
  epochs.Report(Report("w2", 1), failed + absl::Milliseconds(20));
  tandem::v1::BroadcastGroup g =
      epochs.OnPublish(4, failed + absl::Milliseconds(100));
  CHECK(g.epoch() == 2);
  CHECK(g.first_policy_version() == 4);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1", "w2"});
  CHECK_FALSE(epochs.Regroup(failed + absl::Seconds(1)).has_value());
  CHECK(epochs.Current().epoch() == 2);
  CHECK(epochs.Stats().resend_epochs == 0);
}

TEST_CASE(
    "with no receiver left nothing is re-sent; the next publish "
    "decides") {
  auto owned = NewWithTrainer();
  BroadcastEpochs& epochs = *owned;
  epochs.Report(Report("w1", 0), kT0);
  REQUIRE(epochs.OnPublish(1, kT0).epoch() == 1);
  epochs.Report(Report("w1", 1, 1), kT0);
  epochs.Report(Failed("t", 1, 1), kT0 + absl::Seconds(1));
  CHECK_FALSE(epochs.Regroup(kT0 + absl::Seconds(2)).has_value());
  CHECK(epochs.Current().epoch() == 1);
  // The killed worker's successor, caught up, is in the next epoch.
  epochs.Report(Report("w1b", 1), kT0 + absl::Seconds(3));
  tandem::v1::BroadcastGroup g = epochs.OnPublish(2, kT0 + absl::Seconds(3));
  CHECK(g.epoch() == 2);
  CHECK(Members(g) == std::vector<std::string>{"t", "w1b"});
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
