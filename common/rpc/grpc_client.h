#pragma once

// Client-side helpers: every call carries a deadline, and UNAVAILABLE is
// retried with capped exponential backoff and jitter until an overall budget
// runs out. Conversions between absl::Status and grpc::Status live here too.

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/rpc/tls_options.h"

namespace tandem::rpc {

struct RetryPolicy {
  // Deadline of each attempt.
  absl::Duration attempt_timeout = absl::Seconds(5);
  // Total time across attempts, including backoff sleeps.
  absl::Duration total_timeout = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // Measures total_timeout and sleeps the backoff (common/base/clock.h);
  // outlives the call. Each attempt's gRPC deadline stays real time (as
  // far from now as attempt_timeout, or the budget left on this clock if
  // less), so a fake clock never stops a real call from timing out.
  Clock* clock = RealClock();
};

// Runs `call` with a fresh ClientContext carrying the attempt deadline,
// retrying on UNAVAILABLE (and DEADLINE_EXCEEDED of an attempt when budget
// remains). `what` names the RPC in the returned error. Attempt k > 1
// follows a pause of policy.clock, drawn uniformly from [b/2, b) with
// b = min(initial_backoff * 2^(k-2), max_backoff); no attempt starts
// whose pause would end at or past the budget.
absl::Status CallWithRetry(
    const std::string& what, const RetryPolicy& policy,
    const std::function<grpc::Status(grpc::ClientContext*)>& call);

// A channel to host:port with keepalive suited to the control plane:
// plaintext when tls.mode is off, else mutual TLS with tls's certificate
// (common/rpc/tls_credentials.h says what is verified).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const TlsOptions& tls);

absl::Status ToAbslStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace tandem::rpc
