#include "services/coordinator/cluster_watchers.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

using tandem::v1::ClusterEvent;

// One WatchCluster stream. Writes go out one at a time; queued events
// coalesce by kind (ClusterWatchers' contract). Deletes itself in OnDone.
class ClusterWatchers::Stream : public grpc::ServerWriteReactor<ClusterEvent> {
 public:
  explicit Stream(ClusterWatchers* owner) : owner_(owner) {}

  // Queues `event` (replacing a queued one of the same kind) and starts a
  // write when none is in flight. `last`: finish with OK after it; nothing
  // is queued after a last event.
  void Enqueue(const ClusterEvent& event, bool last) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || finish_after_) return;
      auto same = std::find_if(
          queue_.begin(), queue_.end(), [&](const ClusterEvent& queued) {
            return queued.event_case() == event.event_case();
          });
      if (same != queue_.end()) {
        *same = event;
      } else {
        queue_.push_back(event);
      }
      finish_after_ = last;
      if (!writing_) {
        writing_ = true;
        in_flight_ = std::move(queue_.front());
        queue_.pop_front();
        start = true;
      }
    }
    if (start) StartWrite(&in_flight_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        // The call broke or was cancelled: nothing more can be written.
        writing_ = false;
        queue_.clear();
        if (!finished_) {
          finished_ = true;
          finish =
              grpc::Status(grpc::StatusCode::CANCELLED, "watch stream broken");
        }
      } else if (!queue_.empty()) {
        in_flight_ = std::move(queue_.front());
        queue_.pop_front();
        write = true;
      } else {
        writing_ = false;
        if (finish_after_ && !finished_) {
          finished_ = true;
          finish = grpc::Status::OK;
        }
      }
    }
    if (write) StartWrite(&in_flight_);
    if (finish) Finish(*std::move(finish));
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.clear();
      // A write in flight completes with ok = false and finishes there.
      if (!writing_ && !finished_) {
        finished_ = true;
        finish = true;
      }
    }
    if (finish) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    }
  }

  void OnDone() override {
    owner_->Forget(this);
    delete this;
  }

 private:
  ClusterWatchers* const owner_;
  absl::Mutex mu_;
  std::deque<ClusterEvent> queue_ ABSL_GUARDED_BY(mu_);
  // The message being written; touched only by whoever set writing_.
  ClusterEvent in_flight_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_after_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

// Answers one refused call.
class Refusal : public grpc::ServerWriteReactor<ClusterEvent> {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

uint64_t VersionOf(const ClusterEvent& e) {
  return e.policy_version().manifest().policy_version();
}

uint64_t EpochOf(const ClusterEvent& e) {
  return e.membership_epoch().group().epoch();
}

}  // namespace

ClusterWatchers::ClusterWatchers(prometheus::Gauge* open_streams)
    : gauge_(open_streams) {}

ClusterWatchers::~ClusterWatchers() = default;

grpc::ServerWriteReactor<ClusterEvent>* ClusterWatchers::Reject(
    const grpc::Status& status) {
  return new Refusal(status);
}

grpc::ServerWriteReactor<ClusterEvent>* ClusterWatchers::Open() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    return Reject(grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("coordinator is shutting down: ", shutdown_reason_)));
  }
  auto* stream = new Stream(this);
  streams_.insert(stream);
  if (gauge_ != nullptr) gauge_->Increment();
  // Headers at once, so the client knows the stream is served even when
  // there is nothing to snapshot yet.
  stream->StartSendInitialMetadata();
  if (latest_version_) stream->Enqueue(*latest_version_, false);
  if (latest_epoch_) stream->Enqueue(*latest_epoch_, false);
  return stream;
}

void ClusterWatchers::Publish(const ClusterEvent& event) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  switch (event.event_case()) {
    case ClusterEvent::kPolicyVersion:
      if (latest_version_ && VersionOf(*latest_version_) >= VersionOf(event)) {
        return;
      }
      latest_version_ = event;
      break;
    case ClusterEvent::kMembershipEpoch:
      if (latest_epoch_ && EpochOf(*latest_epoch_) >= EpochOf(event)) return;
      latest_epoch_ = event;
      break;
    default:
      return;  // shutdown goes through Shutdown()
  }
  for (Stream* stream : streams_) stream->Enqueue(event, false);
}

void ClusterWatchers::Shutdown(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  shutdown_reason_ = reason;
  ClusterEvent event;
  event.mutable_shutdown()->set_reason(reason);
  for (Stream* stream : streams_) stream->Enqueue(event, true);
}

size_t ClusterWatchers::open_streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

void ClusterWatchers::Forget(Stream* stream) {
  absl::MutexLock lock(&mu_);
  if (streams_.erase(stream) > 0 && gauge_ != nullptr) gauge_->Decrement();
}

}  // namespace tandem::coordinator
