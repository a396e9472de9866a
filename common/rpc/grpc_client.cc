#include "common/rpc/grpc_client.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/rpc/tls_credentials.h"

namespace tandem::rpc {

absl::Status ToAbslStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const TlsOptions& tls) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(64 << 20);
  ApplyTargetNameOverride(tls, &args);
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(tls), args);
}

absl::Status CallWithRetry(
    const std::string& what, const RetryPolicy& policy,
    const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  Clock* const clock = policy.clock;
  const absl::Time give_up = clock->Now() + policy.total_timeout;
  absl::Duration backoff = policy.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    // On the clock: whether this attempt's deadline is the budget's end.
    const absl::Duration budget_left = give_up - clock->Now();
    const bool last_by_budget = budget_left <= policy.attempt_timeout;
    context.set_deadline(absl::ToChronoTime(
        absl::Now() + std::min(policy.attempt_timeout, budget_left)));
    grpc::Status status = call(&context);
    if (status.ok()) return absl::OkStatus();
    const bool retryable =
        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
         !last_by_budget);
    if (!retryable || clock->Now() + backoff >= give_up) {
      absl::Status out = ToAbslStatus(status);
      return absl::Status(out.code(),
                          absl::StrCat(what, " failed after ", attempt,
                                       " attempt(s): ", out.message()));
    }
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    clock->SleepFor(backoff * jitter(rng));
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace tandem::rpc
