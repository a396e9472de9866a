#include "services/rollout/weight_subscriber.h"

#include <algorithm>

#include "common/base/status_macros.h"
#include "common/cluster/cluster_watcher.h"
#include "common/model/decoder_model.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/manifest_digest_source.h"

namespace tandem::rollout {
std::function<grpc::Status(const tandem::v1::SyncWeightGroupRequest&,
                           tandem::v1::SyncWeightGroupResponse*)>
SyncWeightGroupVia(cluster::CoordinatorClient* coordinator) {
  return [coordinator](const tandem::v1::SyncWeightGroupRequest& request,
                       tandem::v1::SyncWeightGroupResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    return coordinator->SyncWeightGroup(&context, request, response);
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
  std::unique_ptr<WeightSubscriber> s(new WeightSubscriber(live_version));
  s->model_ = std::move(model);
  s->source_ = source;
  s->options_ = std::move(options);
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
  // Sealed versions (a data-plane key: tls.mode mtls) stay on the host path.
  s->device_go_live_ = s->options_.pull_cuda_ipc != nullptr &&
                       s->options_.pull_cuda_ipc->hands_over() &&
                       s->options_.data_plane_key == nullptr;
  return s;
}

WeightSubscriber::WeightSubscriber(uint64_t live_version)
    : received_(live_version) {}

WeightSubscriber::~WeightSubscriber() { Stop(); }

void WeightSubscriber::Start() {
  if (options_.metrics != nullptr && options_.pull_shared_memory) {
    options_.metrics->ExposeShmFallbacks();
  }
  if (options_.metrics != nullptr && options_.data_plane_key != nullptr) {
    options_.metrics->ExposeDecryptFailures();
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
    options_.clock->SleepFor(options_.poll_interval);
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

bool WeightSubscriber::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

uint64_t WeightSubscriber::received_version() const {
  return received_.version();
}

uint64_t WeightSubscriber::versions_received() const {
  return received_.count();
}

WeightSyncStatus WeightSubscriber::sync_status() const {
  return received_.status();
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
      // Don't pull the version the trainer re-sends in the next epoch.
      if (AwaitingResend(view)) {
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
      options_.clock->SleepFor(absl::Milliseconds(200));
      continue;
    }
    PullOnce(trainer_address_, options_.clock->Now() + PullWait(broadcast));
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
  if (group_ != nullptr) request.set_joined_epoch(received_.epoch());
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

bool WeightSubscriber::AwaitingResend(const ClusterView& view) const {
  return !abandoned_prefix_.empty() &&
         view.group.key_prefix() == abandoned_prefix_ &&
         options_.clock->Now() < abandoned_at_ + options_.resend_wait;
}

}  // namespace tandem::rollout
