#include "services/trainer/weight_publisher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::trainer {
namespace {

auto Log() { return ComponentLogger("trainer"); }

}  // namespace

WeightPublisher::WeightPublisher(const weights::WeightStore* store,
                                 weights::WeightSyncMetrics* metrics,
                                 Clock* clock)
    : store_(store), metrics_(metrics), clock_(clock) {}

absl::StatusOr<std::unique_ptr<WeightPublisher>> WeightPublisher::Create(
    const weights::BroadcastSenderOptions& options,
    const weights::WeightStore* store, weights::WeightSyncMetrics* metrics,
    Clock* clock) {
  std::unique_ptr<WeightPublisher> publisher(
      new WeightPublisher(store, metrics, clock));
  publisher->timeout_ = options.timeout;
  WeightPublisher* self = publisher.get();
  absl::StatusOr<std::unique_ptr<weights::BroadcastSender>> sender =
      weights::BroadcastSender::Create(
          options,
          [self](const weights::BroadcastOutcome& o) { self->OnBroadcast(o); });
  if (!sender.ok()) return sender.status();
  publisher->sender_ = *std::move(sender);
  return publisher;
}

WeightPublisher::~WeightPublisher() { Stop(); }

bool WeightPublisher::WaitIdleForTest(absl::Duration timeout) const {
  return sender_->WaitIdleForTest(timeout);
}

std::string WeightPublisher::store_address() const {
  return sender_->store_address();
}

void WeightPublisher::Start(Coordinator coordinator) {
  coordinator_ = std::move(coordinator);
  // Wakes ResendAfterFailure when the coordinator announces the re-send
  // epoch.
  watcher_ = std::make_unique<cluster::ClusterWatcher>(
      coordinator_.client,
      cluster::ClusterWatcherOptions{.member_id = coordinator_.member_id,
                                     .clock = clock_});
  sender_->Start();
  watcher_->Start();
}

void WeightPublisher::Broadcast(const tandem::v1::BroadcastGroup& group,
                                const std::string& member_id,
                                weights::PublishedVersion published) {
  if (stopping_) return;
  // Sent in the background to the group the coordinator assigned to this
  // version; a group whose rank 0 is not this trainer is not ours. The
  // delta on v-1, when there is one, is sent instead of the full copy when
  // every receiver of the epoch holds v-1 (broadcast_sender.h).
  tandem::v1::BroadcastGroup ours = group;
  if (ours.member_ids_size() == 0 || ours.member_ids(0) != member_id) {
    ours.clear_member_ids();
  }
  // A FULL version with a device copy goes from it over NCCL (unsealed).
  sender_->Enqueue(ours, std::move(published.full), std::move(published.delta),
                   std::move(published.full_device));
}

void WeightPublisher::Stop(absl::Duration drain) {
  stopping_ = true;
  if (stopped_.exchange(true)) return;
  // Ends a re-send's wait for the next epoch at once (WaitForChange returns
  // after Stop), then the broadcast: drained, aborted, its thread joined.
  if (watcher_) watcher_->Stop();
  sender_->Stop(drain);
}

void WeightPublisher::OnBroadcast(const weights::BroadcastOutcome& outcome) {
  metrics_->SetEpoch(outcome.group.epoch(),
                     outcome.group.member_ids_size() - 1);
  if (outcome.status.ok()) {
    metrics_->RecordVersion(
        weights::SyncDirection::kSent, weights::SyncTransport::kBroadcast,
        outcome.full, static_cast<double>(outcome.bytes), outcome.seconds);
    if (outcome.resend) {
      Log()->info("re-sent version {} in broadcast epoch {} ({} receivers)",
                  outcome.version, outcome.group.epoch(),
                  outcome.group.member_ids_size() - 1);
    }
    return;
  }
  metrics_->RecordAborted();
  if (stopping_) {
    // Cut short by Stop(): the trainer is leaving, the receivers saw the
    // reset and catch up by pull.
    Log()->info(
        "broadcast of version {} to epoch {} aborted at shutdown: {}",
        outcome.version, outcome.group.epoch(), outcome.status.ToString());
    return;
  }
  // A backend this trainer cannot run turned broadcast off for good: report
  // the epoch failed, but there is nothing to re-send.
  const bool off = !sender_->unavailable().ok();
  Log()->warn(
      "broadcast of version {} to epoch {} ({} receivers) failed after "
      "{:.2f}s: {}{}",
      outcome.version, outcome.group.epoch(),
      outcome.group.member_ids_size() - 1, outcome.seconds,
      outcome.status.ToString(),
      off ? "" : "; re-sending it in the next epoch");
  tandem::v1::SyncWeightGroupRequest report;
  report.set_member_id(coordinator_.member_id());
  report.set_policy_version(outcome.version);
  report.set_failed_epoch(outcome.group.epoch());
  report.set_failure(outcome.status.ToString());
  tandem::v1::SyncWeightGroupResponse ignored;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  grpc::Status s =
      coordinator_.client->SyncWeightGroup(&context, report, &ignored);
  if (!s.ok()) {
    Log()->warn(
        "could not report the failed broadcast: {}; receivers catch "
        "up by pull",
        s.error_message());
    return;
  }
  if (!off) ResendAfterFailure(outcome.group);
}

void WeightPublisher::ResendAfterFailure(
    const tandem::v1::BroadcastGroup& failed) {
  // The coordinator forms the next epoch once the failed epoch's survivors
  // reported leaving it, or after its regroup wait; a publish meanwhile
  // forms it too (then the queued version is the one to send and this
  // re-send is dropped as a duplicate). The coordinator announces the
  // epoch on the watch stream; without one, ask every 50 ms. The last look
  // is at the deadline itself, none after it.
  const std::string me = coordinator_.member_id();
  const absl::Time deadline = clock_->Now() + timeout_;
  for (bool first = true; !stopping_ && clock_->Now() < deadline;
       first = false) {
    if (!first) {
      const absl::Duration interval = watcher_->watching()
                                          ? absl::Seconds(1)
                                          : absl::Milliseconds(50);
      watcher_->WaitForChange(std::min(interval, deadline - clock_->Now()));
      if (stopping_) break;
    }
    tandem::v1::SyncWeightGroupRequest poll;
    poll.set_member_id(me);
    tandem::v1::SyncWeightGroupResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    if (!coordinator_.client->SyncWeightGroup(&context, poll, &response).ok()) {
      continue;
    }
    const tandem::v1::BroadcastGroup& group = response.group();
    if (group.key_prefix() == failed.key_prefix()) continue;
    if (group.member_ids_size() < 2 || group.member_ids(0) != me) return;
    absl::StatusOr<weights::StoredPayload> full = store_->Get(
        group.first_policy_version(), tandem::v1::WEIGHT_PAYLOAD_KIND_FULL);
    if (!full.ok()) {
      Log()->warn("cannot re-send version {} in epoch {}: {}",
                  group.first_policy_version(), group.epoch(),
                  full.status().ToString());
      return;
    }
    sender_->Resend(group, *std::move(full));
    return;
  }
  if (!stopping_) {
    Log()->warn(
        "no broadcast epoch after {} within {}; receivers catch up by pull",
        failed.epoch(), absl::FormatDuration(timeout_));
  }
}

}  // namespace tandem::trainer
