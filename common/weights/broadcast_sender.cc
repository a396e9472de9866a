#include "common/weights/broadcast_sender.h"

#include "absl/strings/str_cat.h"

namespace tandem::weights {

BroadcastSender::BroadcastSender(const BroadcastSenderOptions& options,
                                 Listener listener)
    : options_(options), listener_(std::move(listener)) {}

absl::StatusOr<std::unique_ptr<BroadcastSender>> BroadcastSender::Create(
    const BroadcastSenderOptions& options, Listener listener) {
  std::unique_ptr<BroadcastSender> sender(
      new BroadcastSender(options, std::move(listener)));
  absl::StatusOr<std::unique_ptr<GlooRendezvousStore>> store =
      GlooRendezvousStore::Create(options.store_host, options.store_port,
                                  options.timeout);
  if (!store.ok()) return store.status();
  sender->store_ = *std::move(store);
  return sender;
}

BroadcastSender::~BroadcastSender() { Stop(); }

std::string BroadcastSender::store_address() const {
  return absl::StrCat(options_.store_host, ":", store_->port());
}

void BroadcastSender::Start() {
  thread_ = std::thread([this] {
    Run();
    finished_.Notify();
  });
}

void BroadcastSender::Stop() { Stop(absl::InfiniteDuration()); }

bool BroadcastSender::Stop(absl::Duration wait) {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    jobs_.clear();
  }
  if (thread_.joinable()) {
    if (!finished_.WaitForNotificationWithTimeout(wait)) {
      thread_.detach();
      return false;
    }
    thread_.join();
  }
  group_.reset();
  return true;
}

void BroadcastSender::Enqueue(
    const v1::BroadcastGroup& group, const v1::WeightManifest& manifest,
    std::shared_ptr<const std::vector<uint8_t>> payload) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  jobs_.push_back(Job{group, manifest, std::move(payload)});
}

void BroadcastSender::Run() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](BroadcastSender* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->stop_ || !s->jobs_.empty();
          },
          this));
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      // A newer version of the same epoch is waiting: send that one.
      if (!jobs_.empty() &&
          jobs_.front().group.key_prefix() == job.group.key_prefix()) {
        continue;
      }
    }
    Send(job);
  }
}

void BroadcastSender::Send(const Job& job) {
  if (job.group.member_ids_size() < 2) {
    group_.reset();  // nobody to send to; leave the old epoch's group
    group_prefix_ = job.group.key_prefix();
    group_failed_ = false;
    return;
  }
  BroadcastOutcome outcome;
  outcome.group = job.group;
  outcome.version = job.manifest.policy_version();
  outcome.full = job.manifest.kind() != v1::WEIGHT_PAYLOAD_KIND_DELTA;
  outcome.bytes = job.payload->size();
  const absl::Time start = absl::Now();
  if (job.group.key_prefix() != group_prefix_) {
    group_.reset();
    group_prefix_ = job.group.key_prefix();
    group_failed_ = false;
    GlooGroupConfig config;
    config.store_host = options_.store_host;
    config.store_port = store_->port();
    config.key_prefix = job.group.key_prefix();
    config.rank = 0;
    config.world_size = job.group.member_ids_size();
    config.bind_host = options_.bind_host;
    config.timeout = options_.timeout;
    absl::StatusOr<std::unique_ptr<GlooBroadcastGroup>> group =
        GlooBroadcastGroup::Create(config, store_.get());
    if (!group.ok()) {
      group_failed_ = true;
      outcome.status = group.status();
      outcome.seconds = absl::ToDoubleSeconds(absl::Now() - start);
      listener_(outcome);
      return;
    }
    group_ = *std::move(group);
  }
  if (group_failed_ || group_ == nullptr) return;  // epoch already failed
  GlooWeightSender sender(group_.get());
  outcome.status = sender.Publish(job.manifest, *job.payload,
                                  absl::Now() + options_.timeout);
  outcome.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!outcome.status.ok()) {
    group_->Abort();
    group_.reset();  // closes the pairs, so survivors fail fast
    group_failed_ = true;
  }
  listener_(outcome);
}

}  // namespace tandem::weights
