#include "services/rollout/prompt_prefetcher.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"

namespace tandem::rollout {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(3);
constexpr absl::Duration kIdlePoll = absl::Milliseconds(20);

}  // namespace

PromptPrefetcher::PromptPrefetcher(cluster::CoordinatorClient* coordinator,
                                   std::function<std::string()> member_id,
                                   std::function<uint64_t()> policy_version,
                                   int32_t target_depth, Clock* clock)
    : coordinator_(coordinator),
      member_id_(std::move(member_id)),
      policy_version_(std::move(policy_version)),
      target_depth_(target_depth),
      clock_(clock) {}

PromptPrefetcher::~PromptPrefetcher() { Stop(); }

void PromptPrefetcher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void PromptPrefetcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PromptPrefetcher::SetLeasing(bool enabled) {
  absl::MutexLock lock(&mu_);
  leasing_ = enabled;
}

void PromptPrefetcher::Backoff(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  backoff_until_ = std::max(backoff_until_, clock_->Now() + duration);
}

void PromptPrefetcher::SetExcludedEnvironment(std::string environment) {
  absl::MutexLock lock(&mu_);
  excluded_ = std::move(environment);
}

std::vector<tandem::v1::PromptLease> PromptPrefetcher::Take(int32_t n) {
  std::vector<tandem::v1::PromptLease> out;
  absl::MutexLock lock(&mu_);
  for (auto it = queue_.begin();
       it != queue_.end() && static_cast<int32_t>(out.size()) < n;) {
    if (!excluded_.empty() && it->environment() == excluded_) {
      ++it;
      continue;
    }
    out.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  return out;
}

int32_t PromptPrefetcher::depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(queue_.size());
}

uint64_t PromptPrefetcher::leased_total() const {
  absl::MutexLock lock(&mu_);
  return leased_total_;
}

void PromptPrefetcher::Return(const std::vector<std::string>& lease_ids,
                              const std::string& reason) {
  const std::string member = member_id_();
  if (lease_ids.empty() || member.empty()) return;
  tandem::v1::ReturnLeasesRequest request;
  request.set_member_id(member);
  request.set_reason(reason);
  for (const auto& id : lease_ids) request.add_lease_ids(id);
  tandem::v1::ReturnLeasesResponse response;
  rpc::RetryPolicy policy;
  policy.attempt_timeout = kRpcTimeout;
  policy.total_timeout = absl::Seconds(5);
  policy.clock = clock_;
  absl::Status status = rpc::CallWithRetry(
      "ReturnLeases", policy, [&](grpc::ClientContext* context) {
        return coordinator_->ReturnLeases(context, request, &response);
      });
  auto log = ComponentLogger("rollout");
  if (status.ok()) {
    log->info("returned {} lease(s) to the coordinator ({})",
              response.returned(), reason);
  } else {
    log->warn("could not return {} lease(s): {}", lease_ids.size(),
              status.ToString());
  }
}

int32_t PromptPrefetcher::ReturnQueued(const std::string& reason) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& lease : queue_) ids.push_back(lease.lease_id());
    queue_.clear();
  }
  Return(ids, reason);
  return static_cast<int32_t>(ids.size());
}

void PromptPrefetcher::Run() {
  auto log = ComponentLogger("rollout");
  absl::Duration wait = kIdlePoll;
  bool warned = false;
  while (true) {
    int32_t want = 0;
    std::string excluded;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      clock_->AwaitWithTimeout(&mu_, absl::Condition(&stop), wait);
      if (stop_) return;
      if (leasing_ && clock_->Now() >= backoff_until_) {
        excluded = excluded_;
        const auto takeable = std::count_if(
            queue_.begin(), queue_.end(),
            [&](const tandem::v1::PromptLease& lease) {
              return excluded.empty() || lease.environment() != excluded;
            });
        want = target_depth_ - static_cast<int32_t>(takeable);
      }
    }
    wait = kIdlePoll;
    const std::string member = member_id_();
    if (want <= 0 || member.empty()) continue;
    tandem::v1::LeasePromptsRequest request;
    request.set_member_id(member);
    request.set_max_prompts(want);
    request.set_policy_version(policy_version_());
    if (!excluded.empty()) request.add_exclude_environments(excluded);
    tandem::v1::LeasePromptsResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    grpc::Status status =
        coordinator_->LeasePrompts(&context, request, &response);
    if (!status.ok()) {
      if (!warned) {
        log->warn("LeasePrompts failed: {} (retrying)", status.error_message());
        warned = true;
      }
      wait = absl::Milliseconds(200);
      continue;
    }
    warned = false;
    if (response.leases_size() == 0) {
      wait = absl::Milliseconds(
          std::clamp<int64_t>(response.retry_after_ms(), 10, 1000));
      continue;
    }
    absl::MutexLock lock(&mu_);
    for (auto& lease : *response.mutable_leases()) {
      queue_.push_back(std::move(lease));
      ++leased_total_;
    }
  }
}

}  // namespace tandem::rollout
