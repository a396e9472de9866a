#include "common/weights/background_receiver.h"

#include <string>

namespace tandem::weights {

BackgroundReceiver::BackgroundReceiver(WeightReceiver* receiver,
                                       StagingWeights* staging,
                                       BackgroundReceiverOptions options)
    : receiver_(receiver), staging_(staging), options_(options) {}

BackgroundReceiver::~BackgroundReceiver() { Stop(); }

void BackgroundReceiver::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void BackgroundReceiver::Stop() {
  stop_ = true;
  receiver_->Cancel();
  if (thread_.joinable()) thread_.join();
}

BackgroundReceiverStats BackgroundReceiver::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void BackgroundReceiver::Run() {
  while (!stop_.load()) {
    if (!staging_->WaitUntilTaken(absl::Now() + options_.receive_slice)) {
      continue;  // the engine has not committed yet
    }
    absl::StatusOr<uint64_t> got =
        receiver_->ReceiveNext(staging_, absl::Now() + options_.receive_slice);
    if (got.ok()) {
      absl::MutexLock lock(&mu_);
      ++stats_.staged;
      continue;
    }
    if (absl::IsDeadlineExceeded(got.status()) ||
        absl::IsCancelled(got.status()) || stop_.load()) {
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.errors;
      stats_.last_error = std::string(got.status().message());
    }
    options_.clock->SleepFor(options_.retry_backoff);
  }
}

}  // namespace tandem::weights
