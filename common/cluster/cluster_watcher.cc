#include "common/cluster/cluster_watcher.h"

#include <algorithm>
#include <utility>

#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"

namespace tandem::cluster {
namespace {

auto Log() { return ComponentLogger("cluster"); }

}  // namespace

ClusterWatcher::ClusterWatcher(CoordinatorClient* client,
                               ClusterWatcherOptions options)
    : client_(client), options_(std::move(options)) {}

ClusterWatcher::~ClusterWatcher() { Stop(); }

void ClusterWatcher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ClusterWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

bool ClusterWatcher::WaitForChange(absl::Duration max_wait) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return changed_ || stop_;
  };
  options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&woken), max_wait);
  const bool changed = changed_;
  changed_ = false;
  return changed;
}

void ClusterWatcher::Wake() {
  absl::MutexLock lock(&mu_);
  MarkChanged();
}

bool ClusterWatcher::watching() const {
  absl::MutexLock lock(&mu_);
  return watching_;
}

uint64_t ClusterWatcher::events_received() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

absl::Status ClusterWatcher::last_status() const {
  absl::MutexLock lock(&mu_);
  return last_status_;
}

void ClusterWatcher::MarkChanged() { changed_ = true; }

void ClusterWatcher::SetChangeListener(ChangeListener listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

void ClusterWatcher::NotifyListener(const tandem::v1::ClusterEvent* event) {
  absl::MutexLock lock(&listener_mu_);
  if (listener_) listener_(event);
}

void ClusterWatcher::Run() {
  absl::Duration backoff = options_.initial_backoff;
  grpc::StatusCode last_code = grpc::StatusCode::OK;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    const std::string member_id =
        options_.member_id ? options_.member_id() : std::string();
    if (options_.member_id && member_id.empty()) {
      // Not registered yet: nothing to watch as.
      absl::MutexLock lock(&mu_);
      options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stop_), backoff);
      continue;
    }
    const absl::Time opened = options_.clock->Now();
    const grpc::Status status = WatchOnce(member_id);
    {
      absl::MutexLock lock(&mu_);
      last_status_ = rpc::ToAbslStatus(status);
      if (stop_) return;
    }
    // A stream that lived a while was healthy: start the backoff afresh.
    if (options_.clock->Now() - opened > options_.max_backoff) {
      backoff = options_.initial_backoff;
    }
    if (status.error_code() != last_code) {
      last_code = status.error_code();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        Log()->warn(
            "the coordinator does not serve WatchCluster; polling it "
            "instead (retrying the watch every {})",
            absl::FormatDuration(options_.max_backoff));
      } else if (!status.ok()) {
        Log()->info("cluster watch ended: {} ({}); reconnecting",
                    status.error_message(),
                    static_cast<int>(status.error_code()));
      }
    }
    absl::MutexLock lock(&mu_);
    options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stop_), backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

grpc::Status ClusterWatcher::WatchOnce(const std::string& member_id) {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return grpc::Status::CANCELLED;
    context_ = &context;
  }
  tandem::v1::WatchClusterRequest request;
  request.set_member_id(member_id);
  std::unique_ptr<ClusterEventStream> reader =
      client_->WatchCluster(&context, request);
  if (reader->WaitUntilOpen()) {
    {
      absl::MutexLock lock(&mu_);
      watching_ = true;
      MarkChanged();
    }
    NotifyListener(nullptr);
  }
  tandem::v1::ClusterEvent event;
  while (reader->Read(&event)) {
    {
      absl::MutexLock lock(&mu_);
      ++events_;
      MarkChanged();
    }
    if (options_.on_event) options_.on_event(event);
    if (event.has_shutdown()) {
      absl::MutexLock lock(&mu_);
      watching_ = false;
    }
    NotifyListener(&event);
  }
  grpc::Status status = reader->Finish();
  bool was_watching = false;
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
    was_watching = watching_;
    if (watching_) MarkChanged();
    watching_ = false;
  }
  if (was_watching) NotifyListener(nullptr);
  return status;
}

}  // namespace tandem::cluster
