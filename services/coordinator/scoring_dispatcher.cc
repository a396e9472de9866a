#include "services/coordinator/scoring_dispatcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"

namespace tandem::coordinator {
namespace {

auto Log() { return ComponentLogger("coordinator"); }

}  // namespace

absl::StatusOr<tandem::v1::ScoreBatchResponse> GrpcVerifierClient::ScoreBatch(
    const std::string& address, const tandem::v1::ScoreBatchRequest& request,
    absl::Duration timeout) {
  tandem::v1::Verifier::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = stubs_[address];
    if (!slot) slot = tandem::v1::Verifier::NewStub(rpc::MakeChannel(address));
    stub = slot.get();
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = stub->ScoreBatch(&context, request, &response);
  if (!status.ok()) return rpc::ToAbslStatus(status);
  return response;
}

ScoringDispatcher::ScoringDispatcher(ScoringDispatcherOptions options,
                                     VerifierClient* client,
                                     AddressSource addresses, ScoreSink sink)
    : options_(options),
      client_(client),
      addresses_(std::move(addresses)),
      sink_(std::move(sink)) {}

ScoringDispatcher::~ScoringDispatcher() { Stop(); }

void ScoringDispatcher::Start() {
  for (uint32_t i = 0; i < std::max<uint32_t>(options_.concurrency, 1); ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

void ScoringDispatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

void ScoringDispatcher::Enqueue(std::vector<ScoringTask> tasks) {
  absl::MutexLock lock(&mu_);
  for (auto& task : tasks) queue_.push_back(Entry{std::move(task), false});
}

ScoringStats ScoringDispatcher::Stats() const {
  absl::MutexLock lock(&mu_);
  ScoringStats stats = stats_;
  stats.queued = queue_.size();
  return stats;
}

bool ScoringDispatcher::TakeBatch(std::vector<Entry>* batch) {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !queue_.empty();
  };
  mu_.Await(absl::Condition(&has_work));
  if (stop_) return false;
  // Give a partial batch a moment to fill.
  if (queue_.size() < options_.batch_size && !queue_.front().alone &&
      options_.batch_wait > absl::ZeroDuration()) {
    auto full = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || queue_.size() >= options_.batch_size || queue_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&full), options_.batch_wait);
    if (stop_) return false;
    if (queue_.empty()) return true;  // another thread took them
  }
  if (queue_.front().alone) {
    batch->push_back(std::move(queue_.front()));
    queue_.pop_front();
  } else {
    while (!queue_.empty() && !queue_.front().alone &&
           batch->size() < options_.batch_size) {
      batch->push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
  }
  stats_.in_flight += batch->size();
  return true;
}

void ScoringDispatcher::Requeue(std::vector<Entry> batch, bool alone) {
  absl::MutexLock lock(&mu_);
  stats_.in_flight -= batch.size();
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
    it->alone = it->alone || alone;
    queue_.push_front(std::move(*it));
  }
}

void ScoringDispatcher::SleepUnlessStopped(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopping), duration);
}

void ScoringDispatcher::Run() {
  while (true) {
    std::vector<Entry> batch;
    if (!TakeBatch(&batch)) return;
    if (batch.empty()) continue;
    std::vector<std::string> addresses = addresses_();
    if (addresses.empty()) {
      Requeue(std::move(batch), false);
      SleepUnlessStopped(options_.retry_backoff);
      continue;
    }
    std::sort(addresses.begin(), addresses.end());
    std::string address;
    {
      absl::MutexLock lock(&mu_);
      address = addresses[next_replica_++ % addresses.size()];
    }
    tandem::v1::ScoreBatchRequest request;
    for (const Entry& entry : batch) *request.add_items() = entry.task.item;
    absl::StatusOr<tandem::v1::ScoreBatchResponse> response =
        client_->ScoreBatch(address, request, options_.timeout);
    if (response.ok() && response->results_size() != request.items_size()) {
      response = absl::InternalError(absl::StrCat(
          "verifier at ", address, " returned ", response->results_size(),
          " results for ", request.items_size(), " items"));
    }
    if (!response.ok()) {
      const bool malformed =
          response.status().code() == absl::StatusCode::kInvalidArgument;
      {
        absl::MutexLock lock(&mu_);
        ++stats_.calls_failed;
      }
      if (malformed && batch.size() == 1) {
        tandem::v1::Score score;
        score.set_reward(0.0);
        score.set_outcome("invalid_request");
        score.set_reason(std::string(response.status().message()));
        Log()->warn("verifier refused sample {}: {}",
                    batch[0].task.item.item_id(), response.status().ToString());
        sink_(batch[0].task, score);
        absl::MutexLock lock(&mu_);
        --stats_.in_flight;
        ++stats_.items_invalid;
        continue;
      }
      Log()->warn("ScoreBatch of {} items at {} failed: {}; retrying",
                  batch.size(), address, response.status().ToString());
      Requeue(std::move(batch), malformed);
      if (!malformed) SleepUnlessStopped(options_.retry_backoff);
      continue;
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      sink_(batch[i].task, response->results(i).score());
    }
    absl::MutexLock lock(&mu_);
    ++stats_.calls_ok;
    stats_.items_scored += batch.size();
    stats_.in_flight -= batch.size();
  }
}

}  // namespace tandem::coordinator
