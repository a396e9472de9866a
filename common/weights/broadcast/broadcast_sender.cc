#include "common/weights/broadcast/broadcast_sender.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::weights {

absl::Status SendPayload(BroadcastGroup* group, const StoredPayload& payload,
                         const DeviceFlat* device,
                         const DevicePublish& device_publish,
                         const DataPlaneKeyHolder* keys, absl::Time deadline,
                         SentFrom* from) {
  const bool use_device =
      device != nullptr && device->data != nullptr && device_publish &&
      keys == nullptr &&
      payload.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL &&
      group->broadcasts_device_memory();
  if (from != nullptr) *from = use_device ? SentFrom::kDevice : SentFrom::kHost;
  if (use_device) {
    if (device->bytes != payload.manifest.total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "broadcast of weights v", payload.manifest.policy_version(),
          ": the device copy holds ", device->bytes,
          " bytes, the manifest's total_bytes is ",
          payload.manifest.total_bytes()));
    }
    return device_publish(group, payload.manifest, device->data,
                          device->bytes);
  }
  BroadcastWeightSender sender(group, keys);
  return sender.Publish(payload.manifest, *payload.bytes, deadline);
}

BroadcastSender::BroadcastSender(const BroadcastSenderOptions& options,
                                 Listener listener)
    : options_(options), listener_(std::move(listener)) {}

absl::StatusOr<std::unique_ptr<BroadcastSender>> BroadcastSender::Create(
    const BroadcastSenderOptions& options, Listener listener) {
  std::unique_ptr<BroadcastSender> sender(
      new BroadcastSender(options, std::move(listener)));
  // Over the trainer's gRPC: no store port at all.
  if (options.rendezvous_keys != nullptr) return sender;
  absl::StatusOr<std::unique_ptr<GlooRendezvousStore>> store =
      GlooRendezvousStore::Create(options.store_host, options.store_port,
                                  options.timeout);
  if (!store.ok()) return store.status();
  sender->store_ = *std::move(store);
  return sender;
}

BroadcastSender::~BroadcastSender() { Stop(); }

std::string BroadcastSender::store_address() const {
  if (store_ == nullptr) return kGrpcRendezvousAddress;
  return absl::StrCat(options_.store_host, ":", store_->port());
}

absl::Status BroadcastSender::unavailable() const {
  absl::MutexLock lock(&mu_);
  return unavailable_;
}

bool BroadcastSender::WaitIdleForTest(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return jobs_.empty() && !busy_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void BroadcastSender::Start() {
  thread_ = std::thread([this] { Run(); });
}

void BroadcastSender::Stop(absl::Duration drain) {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    jobs_.clear();
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
    mu_.AwaitWithTimeout(absl::Condition(&idle), drain);
    // The drain is over: end the rendezvous or collective under way (its
    // failure is reported as Cancelled), under mu_ so that the group
    // cannot be destroyed meanwhile.
    cancelled_ = true;
    if (active_group_ != nullptr) active_group_->Abort();
  }
  if (thread_.joinable()) thread_.join();
  SetGroup(nullptr);
}

void BroadcastSender::SetGroup(std::unique_ptr<BroadcastGroup> group) {
  {
    absl::MutexLock lock(&mu_);
    active_group_ = group.get();
    // A group formed while Stop() was aborting: abort it too.
    if (cancelled_ && group != nullptr) group->Abort();
  }
  group_ = std::move(group);  // destroys the previous group outside mu_
}

void BroadcastSender::Enqueue(const v1::BroadcastGroup& group,
                              StoredPayload full,
                              std::optional<StoredPayload> delta,
                              std::optional<DeviceFlat> full_device) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  jobs_.push_back(Job{group, std::move(full), std::move(delta), false,
                      std::move(full_device)});
}

void BroadcastSender::Enqueue(
    const v1::BroadcastGroup& group, const v1::WeightManifest& manifest,
    std::shared_ptr<const std::vector<uint8_t>> payload) {
  Enqueue(group, StoredPayload{manifest, std::move(payload)});
}

void BroadcastSender::Resend(const v1::BroadcastGroup& group,
                             StoredPayload full) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  jobs_.push_front(Job{group, std::move(full), std::nullopt, true});
}

void BroadcastSender::Run() {
  if (options_.on_thread_start) options_.on_thread_start();
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      mu_.Await(absl::Condition(
          +[](BroadcastSender* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->stop_ || !s->jobs_.empty();
          },
          this));
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      // The same or a newer version of the same epoch is waiting: send
      // that one.
      const bool superseded =
          std::any_of(jobs_.begin(), jobs_.end(), [&](const Job& later) {
            return later.group.key_prefix() == job.group.key_prefix() &&
                   later.version() >= job.version();
          });
      if (superseded) continue;
      busy_ = true;
    }
    Send(job);
  }
}

BroadcastGroupConfig BroadcastSender::GroupConfig(
    const v1::BroadcastGroup& group) const {
  BroadcastGroupConfig config;
  config.backend = group.backend();
  config.store_host = options_.store_host;
  config.store_port = store_ != nullptr ? store_->port() : 0;
  config.rendezvous = options_.rendezvous_keys;
  config.key_prefix = group.key_prefix();
  config.rank = 0;
  config.world_size = group.member_ids_size();
  config.bind_host = options_.bind_host;
  config.timeout = options_.timeout;
  config.cancelled = &cancelled_;
  return config;
}

bool BroadcastSender::JoinEpoch(const Job& job, BroadcastOutcome* outcome) {
  const uint64_t v = job.version();
  // Every receiver of the new epoch holds v-1 when v is its first version
  // and the epoch before ended cleanly: its members got v-1 (or it had
  // none), and the coordinator adds a member only when it holds v-1.
  const bool base_carries = !job.resend && !group_failed_ &&
                            v == job.group.first_policy_version() &&
                            (no_receivers_ || (holds_ && *holds_ + 1 == v));
  SetGroup(nullptr);
  if (!group_prefix_.empty()) {
    if (options_.rendezvous_keys != nullptr) {
      options_.rendezvous_keys->RetireScope(group_prefix_);
    }
    left_prefixes_.push_back(group_prefix_);
    while (left_prefixes_.size() > 64) left_prefixes_.pop_front();
  }
  group_prefix_ = job.group.key_prefix();
  group_failed_ = false;
  sent_ = 0;
  holds_.reset();
  if (base_carries && v > 0) holds_ = v - 1;
  no_receivers_ = job.group.member_ids_size() < 2;
  if (no_receivers_) return true;
  const BroadcastGroupConfig config = GroupConfig(job.group);
  if (options_.rendezvous_keys != nullptr) {
    options_.rendezvous_keys->EnterScope(group_prefix_);
  }
  const absl::Time start = absl::Now();
  ++rendezvous_started_;
  absl::StatusOr<std::unique_ptr<BroadcastGroup>> group =
      CreateBroadcastGroup(config, store_.get());
  if (!group.ok()) {
    group_failed_ = true;
    holds_.reset();
    if (group.status().code() == absl::StatusCode::kFailedPrecondition) {
      // This trainer cannot run the backend: no later epoch would do
      // better. Broadcast is off; workers pull.
      outcome->status = absl::FailedPreconditionError(absl::StrCat(
          group.status().message(),
          "; weight broadcast is off for this trainer (rollout workers "
          "receive every version by pull)"));
      {
        absl::MutexLock lock(&mu_);
        unavailable_ = outcome->status;
      }
      // The receivers wait for rank 0 in the rendezvous: tell them.
      RefuseBroadcastGroup(config, outcome->status.message()).IgnoreError();
    } else {
      outcome->status = group.status();
    }
    outcome->seconds = absl::ToDoubleSeconds(absl::Now() - start);
    listener_(*outcome);
    return false;
  }
  SetGroup(*std::move(group));
  return true;
}

void BroadcastSender::Send(const Job& job) {
  const std::string& prefix = job.group.key_prefix();
  if (std::find(left_prefixes_.begin(), left_prefixes_.end(), prefix) !=
      left_prefixes_.end()) {
    return;  // an epoch already left (e.g. the one a re-send replaced)
  }
  absl::Status unavailable;
  {
    absl::MutexLock lock(&mu_);
    unavailable = unavailable_;
  }
  if (!unavailable.ok()) {
    // Broadcast is off (reported once). Receivers listed in a new epoch
    // are told at once rather than at their rendezvous deadline.
    if (prefix != group_prefix_) {
      group_prefix_ = prefix;
      if (job.group.member_ids_size() >= 2) {
        RefuseBroadcastGroup(GroupConfig(job.group), unavailable.message())
            .IgnoreError();
      }
    }
    return;
  }
  BroadcastOutcome outcome;
  outcome.group = job.group;
  outcome.version = job.version();
  outcome.resend = job.resend;
  const absl::Time start = absl::Now();
  if (prefix != group_prefix_ && !JoinEpoch(job, &outcome)) return;
  if (no_receivers_ || group_failed_ || group_ == nullptr) {
    return;  // nobody to send to, or the epoch already failed
  }
  if (job.version() <= sent_) return;  // sent already (e.g. re-sent)
  const bool delta = !job.resend && job.delta.has_value() && holds_ &&
                     job.delta->manifest.base_version() == *holds_;
  const StoredPayload& payload = delta ? *job.delta : job.full;
  outcome.full = !delta;
  outcome.bytes = payload.bytes->size();
  ++collectives_started_;
  SentFrom from = SentFrom::kHost;
  outcome.status =
      SendPayload(group_.get(), payload,
                  delta || !job.full_device ? nullptr : &*job.full_device,
                  options_.device_publish, options_.data_plane_key.get(),
                  absl::Now() + options_.timeout, &from);
  outcome.from_device = from == SentFrom::kDevice;
  outcome.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (outcome.status.ok()) {
    sent_ = job.version();
    holds_ = job.version();
  } else {
    group_->Abort();  // fails the connections, so survivors fail fast
    SetGroup(nullptr);
    group_failed_ = true;
    holds_.reset();
  }
  if (!outcome.status.ok() && cancelled_) {
    outcome.status = absl::CancelledError(
        absl::StrCat("the sender stopped during the broadcast (",
                     outcome.status.message(), ")"));
  }
  listener_(outcome);
}

}  // namespace tandem::weights
