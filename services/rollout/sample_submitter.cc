#include "services/rollout/sample_submitter.h"

#include <algorithm>
#include <vector>

#include "common/base/logging.h"

namespace tandem::rollout {

SampleSubmitter::SampleSubmitter(tandem::v1::Coordinator::Stub* stub,
                                 std::function<std::string()> member_id,
                                 int32_t max_batch)
    : stub_(stub), member_id_(std::move(member_id)), max_batch_(max_batch) {}

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
    return queue_.empty() && in_flight_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&empty), deadline);
}

size_t SampleSubmitter::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + static_cast<size_t>(in_flight_);
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

void SampleSubmitter::Run() {
  auto log = ComponentLogger("rollout");
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    tandem::v1::SubmitSamplesRequest request;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stop_) return;
      if (queue_.empty()) continue;
      while (!queue_.empty() && request.samples_size() < max_batch_) {
        *request.add_samples() = std::move(queue_.front());
        queue_.pop_front();
      }
      in_flight_ = request.samples_size();
    }
    request.set_member_id(member_id_());
    tandem::v1::SubmitSamplesResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status status = stub_->SubmitSamples(&context, request, &response);
    const bool retry =
        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = 0;
      if (status.ok()) {
        submitted_ += response.accepted() + response.duplicates();
        rejected_ += response.rejected_sample_ids_size();
      } else if (retry) {
        // Back in front, in order, for the next attempt.
        for (int i = request.samples_size() - 1; i >= 0; --i) {
          queue_.push_front(std::move(*request.mutable_samples(i)));
        }
      } else {
        rejected_ += request.samples_size();
      }
    }
    if (status.ok()) {
      if (response.rejected_sample_ids_size() > 0) {
        log->warn("coordinator rejected {} sample(s) (expired leases)",
                  response.rejected_sample_ids_size());
      }
      backoff = absl::Milliseconds(50);
    } else if (retry) {
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    } else {
      log->warn("SubmitSamples failed, dropping {} sample(s): {}",
                request.samples_size(), status.error_message());
    }
  }
}

}  // namespace tandem::rollout
