// The WeightSubscriber's broadcast receive path: joining an epoch's group,
// receiving its versions in order, leaving it (and reporting a failed one).
// Part of the WeightSubscriber class (weight_subscriber.h); runs on the
// subscriber's thread.

#include <algorithm>

#include "absl/strings/numbers.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/rendezvous_client.h"
#include "common/weights/pull/manifest_digest_source.h"
#include "services/rollout/weight_subscriber.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

// Splits "host:port" at the last colon.
bool SplitHostPort(const std::string& address, std::string* host,
                   uint16_t* port) {
  const size_t colon = address.rfind(':');
  uint32_t p = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &p) || p > 65535) {
    return false;
  }
  *host = address.substr(0, colon);
  *port = static_cast<uint16_t>(p);
  return true;
}

}  // namespace

void WeightSubscriber::BroadcastStep(const ClusterView& view, int rank) {
  const tandem::v1::BroadcastGroup& g = view.group;
  if (joined_prefix_ != g.key_prefix() && !JoinEpoch(g, rank)) return;
  if (view.policy_version <= stream_version_) {
    WaitForCluster();
    return;
  }
  // The trainer broadcasts every version published in this epoch (or a
  // newer one of the same epoch): one round is due.
  ReceiveBroadcast(g);
}

bool WeightSubscriber::JoinEpoch(const tandem::v1::BroadcastGroup& g,
                                 int rank) {
  LeaveGroup();
  weights::BroadcastGroupConfig config;
  config.backend = g.backend();
  if (g.store_address() == weights::kGrpcRendezvousAddress) {
    // mTLS clusters: the rendezvous goes through the trainer's gRPC
    // Rendezvous service, at the address this worker pulls from, with
    // this worker's certificate (rendezvous_client.h).
    if (trainer_address_.empty()) {
      abandoned_prefix_ = g.key_prefix();
      Log()->warn(
          "broadcast epoch {}: the rendezvous is over the trainer's gRPC, "
          "but the coordinator named no trainer address yet",
          g.epoch());
      return false;
    }
    config.rendezvous = std::make_shared<weights::RendezvousClient>(
        rpc::MakeChannel(trainer_address_, options_.tls), trainer_address_,
        options_.timeout);
  } else if (!SplitHostPort(g.store_address(), &config.store_host,
                            &config.store_port)) {
    abandoned_prefix_ = g.key_prefix();
    Log()->warn("broadcast epoch {}: bad store address '{}'", g.epoch(),
                g.store_address());
    return false;
  }
  config.key_prefix = g.key_prefix();
  config.rank = rank;
  config.world_size = g.member_ids_size();
  config.bind_host = options_.bind_host;
  config.timeout = options_.timeout;
  joined_prefix_ = g.key_prefix();
  received_.SetEpoch(g.epoch());
  const absl::Time start = absl::Now();
  // An NCCL group runs on the calling thread's current device: the live
  // weights' one, where the device receive puts each version.
  SelectLiveDevice();
  absl::StatusOr<std::unique_ptr<weights::BroadcastGroup>> group =
      options_.create_group_for_test
          ? options_.create_group_for_test(config)
          : weights::CreateBroadcastGroup(config);
  if (!group.ok()) {
    if (group.status().code() == absl::StatusCode::kFailedPrecondition) {
      // This worker cannot run the backend; no later epoch would do
      // better. Stop asking to join (Poll reports broadcast = false).
      broadcast_off_ = group.status();
      Log()->error(
          "broadcast epoch {}: {}; weight broadcast is off for this "
          "worker, every version is pulled",
          g.epoch(), std::string(group.status().message()));
    }
    AbandonGroup(group.status().ToString());
    // No re-send epoch will list this worker: pull at once.
    if (!broadcast_off_.ok()) abandoned_at_ = absl::InfinitePast();
    return false;
  }
  group_ = *std::move(group);
  group_receiver_ =
      std::make_unique<weights::BroadcastWeightReceiver>(group_.get());
  // Under mTLS versions come sealed with the data-plane key; only those are
  // accepted (docs/operations.md, "Sealed weight data").
  group_receiver_->set_data_plane_keys(options_.data_plane_key.get());
  // The in-band manifest crossed the unauthenticated pair sockets: each
  // version's digest comes from the trainer's GetManifest instead.
  if (!trainer_address_.empty()) {
    broadcast_digests_ = std::make_unique<weights::ManifestDigestSource>(
        rpc::MakeChannel(trainer_address_, options_.tls), options_.timeout);
    group_receiver_->set_trusted_digests(broadcast_digests_.get());
  } else {
    Log()->warn(
        "broadcast epoch {}: no trainer address yet, so versions are checked "
        "against the digest of the manifest that came with the broadcast",
        g.epoch());
  }
  stream_version_ = g.first_policy_version() - 1;
  received_in_epoch_ = false;
  {
    absl::MutexLock lock(&mu_);
    active_group_ = group_.get();
    if (stop_) group_->Abort();
  }
  if (options_.metrics != nullptr) {
    options_.metrics->SetEpoch(g.epoch(), g.member_ids_size() - 1);
  }
  Log()->info("joined broadcast epoch {} as rank {}/{} in {:.3f}s", g.epoch(),
              rank, g.member_ids_size(),
              absl::ToDoubleSeconds(absl::Now() - start));
  return true;
}

void WeightSubscriber::ReceiveBroadcast(const tandem::v1::BroadcastGroup& g) {
  // Into device memory where the group and the live weights allow it
  // (weight_subscriber_broadcast_device.cc).
  if (UseDeviceBroadcast() && ReceiveBroadcastOnDevice(g)) return;
  const absl::Time start = absl::Now();
  const uint64_t bytes_before = staging_->stats().bytes_received;
  const weights::StagingStats staging_before = staging_->stats();
  const uint64_t nonfinite_before = staging_before.nonfinite_versions;
  absl::StatusOr<uint64_t> version =
      group_receiver_->ReceiveNext(staging_.get(), start + options_.timeout);
  CountNonFinite(nonfinite_before, weights::SyncTransport::kBroadcast);
  if (group_receiver_->last_seal().decrypt_failed &&
      options_.metrics != nullptr) {
    options_.metrics->RecordDecryptFailure(weights::SyncTransport::kBroadcast);
  }
  CountDigestChecks(staging_before, weights::SyncTransport::kBroadcast,
                    version.status());
  stream_version_ =
      std::max(stream_version_, group_receiver_->last_round_version());
  if (version.ok()) {
    Deliver(*version, weights::SyncTransport::kBroadcast, start, bytes_before);
    if (!received_in_epoch_) {
      received_in_epoch_ = true;
      const std::optional<v1::WeightManifest> m = staging_->live_manifest();
      Log()->info(
          "received version {} by broadcast, the first of epoch {} "
          "({}, {:.3f}s)",
          *version, g.epoch(),
          m && m->kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA ? "delta" : "full",
          absl::ToDoubleSeconds(absl::Now() - start));
    }
    return;
  }
  if (group_->broken()) {
    AbandonGroup(version.status().ToString());
    return;
  }
  if (version.status().code() == absl::StatusCode::kFailedPrecondition &&
      group_receiver_->last_round_version() <= received_version()) {
    return;  // a version this worker already holds (pulled before joining)
  }
  RejectBroadcast(group_receiver_->last_round_version(), version.status());
}

void WeightSubscriber::RejectBroadcast(uint64_t version,
                                       const absl::Status& why) {
  // The group stays intact for the next version.
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRejected(weights::SyncTransport::kBroadcast);
  }
  Log()->warn("broadcast version {} rejected: {}; pulling it instead",
              version, why.ToString());
  if (!trainer_address_.empty()) {
    PullOnce(trainer_address_, options_.clock->Now() + absl::Seconds(2));
  }
}

void WeightSubscriber::LeaveGroup() {
  if (group_ == nullptr && joined_prefix_.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    active_group_ = nullptr;
  }
  received_.SetEpoch(0);
  group_receiver_.reset();
  broadcast_digests_.reset();
  group_.reset();
  joined_prefix_.clear();
  if (options_.metrics != nullptr) options_.metrics->SetEpoch(0, 0);
}

void WeightSubscriber::AbandonGroup(const std::string& why) {
  const uint64_t epoch = received_.epoch();
  abandoned_prefix_ = joined_prefix_;
  abandoned_at_ = options_.clock->Now();
  failed_epoch_ = epoch;
  failure_ = why;
  if (options_.metrics != nullptr) options_.metrics->RecordAborted();
  if (!stopping()) {
    Log()->warn("left broadcast epoch {}: {}; pulling until the next epoch",
                epoch, why);
  }
  LeaveGroup();
}

}  // namespace tandem::rollout
