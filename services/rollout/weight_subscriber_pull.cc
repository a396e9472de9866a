// The WeightSubscriber's pull path: each version (or, outside the broadcast
// group, the next one) pulled from the trainer's WeightServer, waiting by
// long poll for a newer version; the recovery of lost in-place weights.
// Part of the WeightSubscriber class (weight_subscriber.h); runs on the
// subscriber's thread, except InterruptPullWait.

#include <algorithm>

#include "common/base/logging.h"
#include "common/cluster/cluster_watcher.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "services/rollout/weight_subscriber.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

}  // namespace

absl::Duration WeightSubscriber::PullWait(bool broadcast) const {
  if (!broadcast) return absl::Seconds(1);
  // Outside the group the next poll of the coordinator is due after this
  // wait. While the watcher streams, an epoch event (or the stream ending)
  // ends the wait early (InterruptPullWait), so it waits as long as the
  // watch poll interval; without a stream it pulls in short slices, so that
  // a new epoch listing this worker is noticed quickly.
  if (options_.watcher != nullptr && options_.watcher->watching()) {
    return WatchInterval();
  }
  return absl::Milliseconds(200);
}

void WeightSubscriber::InterruptPullWait() {
  absl::MutexLock lock(&mu_);
  if (receiver_ != nullptr) receiver_->Interrupt();
}

bool WeightSubscriber::EnsurePullReceiver(const std::string& address) {
  if (address == pull_address_ && pull_ != nullptr) return true;
  pull_address_ = address;
  auto receiver = std::make_unique<weights::GrpcPullReceiver>(
      rpc::MakeChannel(address, options_.tls),
      weights::PullOptions{.shared_memory = options_.pull_shared_memory,
                           .cuda_ipc = options_.pull_cuda_ipc,
                           .cuda_ipc_handoff = device_go_live_,
                           .data_plane_key = options_.data_plane_key,
                           .clock = options_.clock});
  absl::MutexLock lock(&mu_);
  receiver_ = receiver.get();
  pull_ = std::move(receiver);
  return !stop_;
}

void WeightSubscriber::PullOnce(const std::string& address,
                                absl::Time deadline) {
  if (!EnsurePullReceiver(address)) return;
  const absl::Time start = absl::Now();
  const uint64_t bytes_before = staging_->stats().bytes_received;
  const weights::StagingStats staging_before = staging_->stats();
  const uint64_t nonfinite_before = staging_before.nonfinite_versions;
  const weights::PullStats before = pull_->stats();
  absl::StatusOr<uint64_t> version =
      pull_->ReceiveNext(staging_.get(), deadline);
  const weights::PullStats after = pull_->stats();
  const weights::SyncTransport transport =
      after.cuda_ipc_versions > before.cuda_ipc_versions
          ? weights::SyncTransport::kCudaIpc
      : after.shm_versions > before.shm_versions
          ? weights::SyncTransport::kShm
          : weights::SyncTransport::kPull;
  // A version the receiver left in the CUDA IPC sink goes live from there.
  const std::optional<v1::WeightManifest> handed_off =
      version.ok() ? pull_->TakeCudaIpcHandoff() : std::nullopt;
  absl::Status result = version.status();
  if (handed_off.has_value()) {
    result = GoLiveOnDevice(*handed_off, transport, start);
  }
  CountNonFinite(nonfinite_before, transport);
  CountDigestChecks(staging_before, transport, result);
  RecordShmFallbacks(before, after);
  if (options_.metrics != nullptr &&
      after.raw_decrypt_failures > before.raw_decrypt_failures) {
    options_.metrics->RecordDecryptFailure(
        weights::SyncTransport::kPull,
        static_cast<double>(after.raw_decrypt_failures -
                            before.raw_decrypt_failures));
  }
  if (version.ok()) {
    if (!handed_off.has_value()) {
      Deliver(*version, transport, start, bytes_before);
    }
    return;
  }
  // DeadlineExceeded: nothing newer yet. Others: the trainer is away or
  // the payload was bad; either way, try again.
  const absl::StatusCode code = version.status().code();
  if (code != absl::StatusCode::kDeadlineExceeded &&
      code != absl::StatusCode::kCancelled) {
    if (code == absl::StatusCode::kDataLoss && options_.metrics != nullptr) {
      options_.metrics->RecordRejected(weights::SyncTransport::kPull);
    }
    Log()->warn("weight pull from {} failed: {}", address,
                version.status().ToString());
    options_.clock->SleepFor(absl::Milliseconds(200));
  }
}

void WeightSubscriber::RecordShmFallbacks(const weights::PullStats& before,
                                          const weights::PullStats& after) {
  if (options_.metrics == nullptr) return;
  auto fallbacks = [&](weights::ShmFallbackReason reason, uint64_t was,
                       uint64_t now) {
    if (now > was) {
      options_.metrics->RecordShmFallbacks(reason,
                                           static_cast<double>(now - was));
    }
  };
  fallbacks(weights::ShmFallbackReason::kNotOffered, before.shm_not_offered,
            after.shm_not_offered);
  fallbacks(weights::ShmFallbackReason::kOpenFailed, before.shm_open_failures,
            after.shm_open_failures);
  fallbacks(weights::ShmFallbackReason::kMismatch, before.shm_mismatches,
            after.shm_mismatches);
}

void WeightSubscriber::RecoverLostWeights() {
  ClusterView view;
  Poll(&view);
  const std::string address = trainer_address_;
  if (address.empty()) {
    options_.clock->SleepFor(absl::Milliseconds(200));
    return;
  }
  Log()->warn(
      "live weights lost (in-place version not verified); the "
      "engine stays parked while the latest full version is pulled "
      "from {}",
      address);
  // A whole transfer's worth of time: a pull cut by its deadline would
  // leave the buffer half-written again.
  const absl::Duration wait = std::max(absl::Seconds(2), options_.timeout);
  PullOnce(address, options_.clock->Now() + wait);
}

}  // namespace tandem::rollout
