#include "services/rollout/sample_submitter.h"

#include <algorithm>
#include <vector>

#include "common/base/logging.h"

namespace tandem::rollout {

SampleSubmitter::SampleSubmitter(cluster::CoordinatorClient* coordinator,
                                 std::function<std::string()> member_id,
                                 int32_t max_batch,
                                 prometheus::Counter* refused, Clock* clock)
    : coordinator_(coordinator),
      member_id_(std::move(member_id)),
      max_batch_(max_batch),
      refused_counter_(refused),
      clock_(clock) {}

SampleSubmitter::~SampleSubmitter() { Stop(); }

void SampleSubmitter::Start() {
  thread_ = std::thread([this] { Run(); });
}

void SampleSubmitter::Enqueue(tandem::v1::Sample sample) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(sample));
}

bool SampleSubmitter::Flush(absl::Duration deadline) {
  absl::MutexLock lock(&mu_);
  auto empty = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && alone_.empty() && in_flight_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&empty), deadline);
}

size_t SampleSubmitter::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + alone_.size() + static_cast<size_t>(in_flight_);
}

void SampleSubmitter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t SampleSubmitter::submitted_total() const {
  absl::MutexLock lock(&mu_);
  return submitted_;
}

uint64_t SampleSubmitter::rejected_total() const {
  absl::MutexLock lock(&mu_);
  return rejected_;
}

uint64_t SampleSubmitter::refused_total() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

uint64_t SampleSubmitter::split_total() const {
  absl::MutexLock lock(&mu_);
  return splits_;
}

void SampleSubmitter::Run() {
  auto log = ComponentLogger("rollout");
  absl::Duration backoff = absl::Milliseconds(50);
  // The request holds one sample of a refused call (from alone_).
  bool alone = false;
  while (true) {
    tandem::v1::SubmitSamplesRequest request;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty() || !alone_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stop_) return;
      if (!alone_.empty()) {
        alone = true;
        *request.add_samples() = std::move(alone_.front());
        alone_.pop_front();
      } else {
        alone = false;
        if (queue_.empty()) continue;
        while (!queue_.empty() && request.samples_size() < max_batch_) {
          *request.add_samples() = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      in_flight_ = request.samples_size();
    }
    request.set_member_id(member_id_());
    tandem::v1::SubmitSamplesResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status status =
        coordinator_->SubmitSamples(&context, request, &response);
    const bool retry =
        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    // Refused whole for (at least) one of its samples: send each alone.
    const bool split = !status.ok() && !retry && request.samples_size() > 1;
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = 0;
      if (status.ok()) {
        submitted_ += response.accepted() + response.duplicates();
        rejected_ += response.rejected_sample_ids_size();
      } else if (retry || split) {
        // Back in front, in order, for the next attempt.
        auto& to = alone || split ? alone_ : queue_;
        for (int i = request.samples_size() - 1; i >= 0; --i) {
          to.push_front(std::move(*request.mutable_samples(i)));
        }
        if (split) ++splits_;
      } else {
        rejected_ += request.samples_size();
        refused_ += request.samples_size();
      }
    }
    if (status.ok()) {
      if (response.rejected_sample_ids_size() > 0) {
        log->warn("coordinator rejected {} sample(s) (expired leases)",
                  response.rejected_sample_ids_size());
      }
      backoff = absl::Milliseconds(50);
    } else if (retry) {
      clock_->SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    } else if (split) {
      log->warn(
          "SubmitSamples of {} samples refused ({}: {}); sending them one by "
          "one so that only the bad ones are lost",
          request.samples_size(), static_cast<int>(status.error_code()),
          status.error_message());
    } else {
      if (refused_counter_ != nullptr) {
        refused_counter_->Increment(request.samples_size());
      }
      log->warn("coordinator refused sample {} ({}: {}); dropping it",
                request.samples(0).sample_id(),
                static_cast<int>(status.error_code()), status.error_message());
    }
  }
}

}  // namespace tandem::rollout
