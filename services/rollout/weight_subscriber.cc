#include "services/rollout/weight_subscriber.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/cluster/cluster_watcher.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/model_flattening.h"

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

std::function<grpc::Status(const tandem::v1::SyncWeightGroupRequest&,
                           tandem::v1::SyncWeightGroupResponse*)>
SyncWeightGroupVia(tandem::v1::Coordinator::Stub* stub) {
  return [stub](const tandem::v1::SyncWeightGroupRequest& request,
                tandem::v1::SyncWeightGroupResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    return stub->SyncWeightGroup(&context, request, response);
  };
}

absl::StatusOr<std::unique_ptr<WeightSubscriber>> WeightSubscriber::Create(
    std::shared_ptr<model::DecoderModel> model, StagedWeightSource* source,
    uint64_t live_version, WeightSyncOptions options) {
  if (!options.sync_weight_group || !options.member_id) {
    return absl::InvalidArgumentError(
        "weight sync needs the coordinator (sync_weight_group) and the "
        "member id: the coordinator names the trainer to pull from");
  }
  std::unique_ptr<WeightSubscriber> s(new WeightSubscriber());
  s->model_ = std::move(model);
  s->source_ = source;
  s->options_ = std::move(options);
  s->received_version_ = live_version;
  s->status_.received_version = live_version;
  if (s->options_.inplace_staging != nullptr) {
    s->staging_ = s->options_.inplace_staging;
    return s;
  }
  s->wire_config_ = s->model_->weights()->config();
  s->wire_config_.dtype =
      s->options_.wire_dtype.value_or(s->wire_config_.dtype);
  ASSIGN_OR_RETURN(weights::FlatWeightLayout layout,
                   weights::LayoutForConfig(s->wire_config_));
  ASSIGN_OR_RETURN(s->staging_,
                   weights::StagingWeights::Create(
                       std::move(layout), weights::StagingMode::kDoubleBuffer));
  return s;
}

WeightSubscriber::~WeightSubscriber() { Stop(); }

void WeightSubscriber::Start() {
  if (options_.metrics != nullptr && options_.pull_shared_memory) {
    options_.metrics->ExposeShmFallbacks();
  }
  if (options_.watcher != nullptr &&
      options_.mode == WeightSyncOptions::Mode::kBroadcast) {
    options_.watcher->SetChangeListener(
        [this](const tandem::v1::ClusterEvent* event) {
          // A new epoch may list this worker, and a stream that opened or
          // ended changes how long a pull may wait (Run): end the wait.
          // A new version needs no wake: the pull waits for exactly that.
          if (event == nullptr || !event->has_policy_version()) {
            InterruptPullWait();
          }
        });
  }
  thread_ = std::thread([this] { Run(); });
}

void WeightSubscriber::InterruptPullWait() {
  absl::MutexLock lock(&mu_);
  if (receiver_ != nullptr) receiver_->Interrupt();
}

void WeightSubscriber::Stop() {
  // Returns once no listener call is under way: none reaches `this` after.
  if (options_.watcher != nullptr) options_.watcher->SetChangeListener(nullptr);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (receiver_ != nullptr) receiver_->Cancel();
    if (active_group_ != nullptr) active_group_->Abort();
  }
  if (options_.watcher != nullptr) options_.watcher->Wake();
  if (thread_.joinable()) thread_.join();
}

void WeightSubscriber::WaitForCluster(bool recovering) {
  if (options_.watcher == nullptr) {
    absl::SleepFor(options_.poll_interval);
    return;
  }
  options_.watcher->WaitForChange(options_.watcher->watching() && !recovering
                                      ? WatchInterval()
                                      : options_.poll_interval);
}

absl::Duration WeightSubscriber::WatchInterval() const {
  if (report_timeout_ <= absl::ZeroDuration()) {
    return options_.watch_poll_interval;
  }
  return std::min(options_.watch_poll_interval, report_timeout_ / 2);
}

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

bool WeightSubscriber::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

uint64_t WeightSubscriber::received_version() const {
  absl::MutexLock lock(&mu_);
  return received_version_;
}

uint64_t WeightSubscriber::versions_received() const {
  absl::MutexLock lock(&mu_);
  return versions_received_;
}

void WeightSubscriber::RecordLive(uint64_t version) {
  int64_t published_ms = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = published_ms_.find(version);
    if (it == published_ms_.end()) return;
    published_ms = it->second;
    published_ms_.erase(published_ms_.begin(), std::next(it));
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordPublishToLive(std::max(
        0.0, absl::ToDoubleSeconds(absl::Now() -
                                   absl::FromUnixMillis(published_ms))));
  }
}

WeightSyncStatus WeightSubscriber::sync_status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void WeightSubscriber::Run() {
  const bool broadcast = options_.mode == WeightSyncOptions::Mode::kBroadcast;
  while (!stopping()) {
    if (staging_->live_lost()) {
      RecoverLostWeights();
      continue;
    }
    ClusterView view;
    // Both modes ask the coordinator, which names the trainer; only
    // broadcast mode joins its groups.
    if (Poll(&view) && broadcast) {
      const int rank = RankIn(view.group);
      if (rank > 0) {
        BroadcastStep(view, rank);
        continue;
      }
      // Just left a failed epoch: the coordinator is forming the next one
      // and the trainer re-sends the version there; don't pull it twice.
      if (!abandoned_prefix_.empty() &&
          view.group.key_prefix() == abandoned_prefix_ &&
          absl::Now() < abandoned_at_ + options_.resend_wait) {
        // The coordinator counts this worker in the re-send epoch only with
        // a report made after the trainer's failure report, which may come
        // after ours: keep reporting at the short interval meanwhile.
        WaitForCluster(/*recovering=*/true);
        continue;
      }
    }
    LeaveGroup();
    // The coordinator's answer, or while it cannot be asked the trainer it
    // last named.
    if (trainer_address_.empty()) {
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    PullOnce(trainer_address_, absl::Now() + PullWait(broadcast));
  }
  LeaveGroup();
  absl::MutexLock lock(&mu_);
  receiver_ = nullptr;
}

bool WeightSubscriber::Poll(ClusterView* view) {
  const std::string member_id = options_.member_id();
  if (member_id.empty()) return false;
  tandem::v1::SyncWeightGroupRequest request;
  request.set_member_id(member_id);
  request.set_policy_version(received_version());
  request.set_broadcast(options_.mode == WeightSyncOptions::Mode::kBroadcast &&
                        broadcast_off_.ok());
  if (group_ != nullptr) {
    absl::MutexLock lock(&mu_);
    request.set_joined_epoch(status_.epoch);
  }
  if (failed_epoch_ != 0) {
    request.set_failed_epoch(failed_epoch_);
    request.set_failure(failure_);
  }
  tandem::v1::SyncWeightGroupResponse response;
  if (!options_.sync_weight_group(request, &response).ok()) return false;
  failed_epoch_ = 0;
  failure_.clear();
  report_timeout_ = absl::Milliseconds(response.report_timeout_ms());
  view->policy_version = response.policy_version();
  view->group = response.group();
  view->weight_server_address = response.weight_server_address();
  if (!view->weight_server_address.empty()) {
    trainer_address_ = view->weight_server_address;
  }
  return true;
}

int WeightSubscriber::RankIn(const tandem::v1::BroadcastGroup& group) const {
  if (group.epoch() == 0 || group.key_prefix() == abandoned_prefix_ ||
      !broadcast_off_.ok()) {
    return -1;
  }
  const std::string me = options_.member_id();
  for (int i = 1; i < group.member_ids_size(); ++i) {
    if (group.member_ids(i) == me) return i;
  }
  return -1;
}

void WeightSubscriber::BroadcastStep(const ClusterView& view, int rank) {
  const tandem::v1::BroadcastGroup& g = view.group;
  if (joined_prefix_ != g.key_prefix()) {
    LeaveGroup();
    weights::BroadcastGroupConfig config;
    config.backend = g.backend();
    if (!SplitHostPort(g.store_address(), &config.store_host,
                       &config.store_port)) {
      abandoned_prefix_ = g.key_prefix();
      Log()->warn("broadcast epoch {}: bad store address '{}'", g.epoch(),
                  g.store_address());
      return;
    }
    config.key_prefix = g.key_prefix();
    config.rank = rank;
    config.world_size = g.member_ids_size();
    config.bind_host = options_.bind_host;
    config.timeout = options_.timeout;
    joined_prefix_ = g.key_prefix();
    {
      absl::MutexLock lock(&mu_);
      status_.epoch = g.epoch();
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<weights::BroadcastGroup>> group =
        weights::CreateBroadcastGroup(config);
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
      return;
    }
    group_ = *std::move(group);
    group_receiver_ =
        std::make_unique<weights::BroadcastWeightReceiver>(group_.get());
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
  }
  if (view.policy_version <= stream_version_) {
    WaitForCluster();
    return;
  }
  // The trainer broadcasts every version published in this epoch (or a
  // newer one of the same epoch): one round is due.
  const absl::Time start = absl::Now();
  const uint64_t bytes_before = staging_->stats().bytes_received;
  const uint64_t nonfinite_before = staging_->stats().nonfinite_versions;
  absl::StatusOr<uint64_t> version =
      group_receiver_->ReceiveNext(staging_.get(), start + options_.timeout);
  CountNonFinite(nonfinite_before, weights::SyncTransport::kBroadcast);
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
  // The version failed verification, or is a delta on a version this
  // worker does not hold: reject it and pull the latest instead; the group
  // stays intact for the next version.
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRejected(weights::SyncTransport::kBroadcast);
  }
  Log()->warn("broadcast version {} rejected: {}; pulling it instead",
              group_receiver_->last_round_version(),
              version.status().ToString());
  if (!trainer_address_.empty()) {
    PullOnce(trainer_address_, absl::Now() + absl::Seconds(2));
  }
}

void WeightSubscriber::LeaveGroup() {
  if (group_ == nullptr && joined_prefix_.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    active_group_ = nullptr;
    status_.epoch = 0;
  }
  group_receiver_.reset();
  group_.reset();
  joined_prefix_.clear();
  if (options_.metrics != nullptr) options_.metrics->SetEpoch(0, 0);
}

void WeightSubscriber::AbandonGroup(const std::string& why) {
  uint64_t epoch = 0;
  {
    absl::MutexLock lock(&mu_);
    epoch = status_.epoch;
  }
  abandoned_prefix_ = joined_prefix_;
  abandoned_at_ = absl::Now();
  failed_epoch_ = epoch;
  failure_ = why;
  if (options_.metrics != nullptr) options_.metrics->RecordAborted();
  if (!stopping()) {
    Log()->warn("left broadcast epoch {}: {}; pulling until the next epoch",
                epoch, why);
  }
  LeaveGroup();
}

void WeightSubscriber::PullOnce(const std::string& address,
                                absl::Time deadline) {
  if (address != pull_address_ || pull_ == nullptr) {
    pull_address_ = address;
    auto receiver = std::make_unique<weights::GrpcPullReceiver>(
        rpc::MakeChannel(address, options_.tls),
        weights::PullOptions{.shared_memory = options_.pull_shared_memory,
                             .data_plane_key = options_.data_plane_key});
    absl::MutexLock lock(&mu_);
    receiver_ = receiver.get();
    pull_ = std::move(receiver);
    if (stop_) return;
  }
  const absl::Time start = absl::Now();
  const uint64_t bytes_before = staging_->stats().bytes_received;
  const uint64_t nonfinite_before = staging_->stats().nonfinite_versions;
  const weights::PullStats before = pull_->stats();
  absl::StatusOr<uint64_t> version =
      pull_->ReceiveNext(staging_.get(), deadline);
  const weights::PullStats after = pull_->stats();
  CountNonFinite(nonfinite_before, after.shm_versions > before.shm_versions
                                       ? weights::SyncTransport::kShm
                                       : weights::SyncTransport::kPull);
  if (options_.metrics != nullptr) {
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
  if (version.ok()) {
    Deliver(*version,
            after.shm_versions > before.shm_versions
                ? weights::SyncTransport::kShm
                : weights::SyncTransport::kPull,
            start, bytes_before);
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
    absl::SleepFor(absl::Milliseconds(200));
  }
}

void WeightSubscriber::CountNonFinite(uint64_t before,
                                      weights::SyncTransport transport) {
  const weights::StagingStats stats = staging_->stats();
  if (stats.nonfinite_versions <= before) return;
  if (options_.metrics != nullptr) {
    for (uint64_t i = before; i < stats.nonfinite_versions; ++i) {
      options_.metrics->RecordNonFinite(transport);
    }
  }
  Log()->error(
      "refused policy version {} received by {}: its weights hold non-finite "
      "values (see the warning that follows); live version {} kept, waiting "
      "for a newer one",
      staging_->refused_version().value_or(0),
      weights::SyncTransportName(transport),
      staging_->live_version().has_value()
          ? std::to_string(*staging_->live_version())
          : std::string("none"));
}

void WeightSubscriber::RecoverLostWeights() {
  ClusterView view;
  Poll(&view);
  const std::string address = trainer_address_;
  if (address.empty()) {
    absl::SleepFor(absl::Milliseconds(200));
    return;
  }
  Log()->warn(
      "live weights lost (in-place version not verified); the "
      "engine stays parked while the latest full version is pulled "
      "from {}",
      address);
  // A whole transfer's worth of time: a pull cut by its deadline would
  // leave the buffer half-written again.
  PullOnce(address, absl::Now() + std::max(absl::Seconds(2), options_.timeout));
}

void WeightSubscriber::Deliver(uint64_t version,
                               weights::SyncTransport transport,
                               absl::Time started, uint64_t bytes_before) {
  absl::Status status = staging_->Commit().status();
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights = nullptr;
  // Inplace: the commit released the engine; nothing to stage.
  if (status.ok() && staging_->mode() != weights::StagingMode::kInplace) {
    weights = weights::UnflattenModel(wire_config_, staging_->layout(),
                                      staging_->live().bytes);
    status = weights.status();
    if (status.ok()) {
      // To the live weights' device and dtype (a no-op for a CPU worker
      // computing in the published dtype).
      weights = MatchLiveWeights(*model_, *std::move(weights));
      status = weights.status();
    }
  }
  if (!status.ok()) {
    if (options_.metrics != nullptr)
      options_.metrics->RecordRejected(transport);
    Log()->warn("policy version {} rejected: {}", version, status.ToString());
    return;
  }
  const absl::Time staged = absl::Now();
  if (*weights != nullptr) source_->Stage(version, *std::move(weights));
  const std::string digest = weights::WeightsDigest(
      staging_->layout().BucketCrcs(staging_->live().bytes));
  const std::optional<v1::WeightManifest> manifest = staging_->live_manifest();
  if (options_.metrics != nullptr && manifest.has_value()) {
    // Zero-copy bucket receipt is not counted by StagingWeights: a FULL
    // version moved total_bytes.
    const bool full = manifest->kind() != v1::WEIGHT_PAYLOAD_KIND_DELTA;
    const uint64_t bytes =
        full ? manifest->total_bytes()
             : staging_->stats().bytes_received - bytes_before;
    // A transfer cannot start before the publish: the pull path's wait for
    // a newer version is not transfer time.
    const absl::Time began =
        manifest->published_unix_ms() > 0
            ? std::max(started,
                       absl::FromUnixMillis(manifest->published_unix_ms()))
            : started;
    options_.metrics->RecordVersion(weights::SyncDirection::kReceived,
                                    transport, full, static_cast<double>(bytes),
                                    absl::ToDoubleSeconds(staged - began));
    if (manifest->published_unix_ms() > 0) {
      options_.metrics->RecordPublishToStaged(
          transport,
          std::max(0.0, absl::ToDoubleSeconds(
                            staged - absl::FromUnixMillis(
                                         manifest->published_unix_ms()))));
    }
  }
  absl::MutexLock lock(&mu_);
  if (manifest.has_value() && manifest->published_unix_ms() > 0) {
    published_ms_[version] = manifest->published_unix_ms();
    while (published_ms_.size() > 16)
      published_ms_.erase(published_ms_.begin());
  }
  received_version_ = version;
  ++versions_received_;
  status_.received_version = version;
  status_.digest = digest;
  status_.transport = weights::SyncTransportName(transport);
}

}  // namespace tandem::rollout
