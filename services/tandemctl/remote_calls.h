#pragma once

// The RPCs behind tandemctl's commands that ask a daemon something (status,
// worker status|pause|resume|drain), and the retry policy of their
// --timeout. A library, apart from main.cc, so that unit tests run the
// commands' calls on a fake clock (tests/unit/tandemctl_test.cc). Links no
// LibTorch, as tandemctl itself.

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/tls_options.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/rollout.pb.h"

namespace tandem::ctl {

// The retry policy of a command's --timeout: attempts and the pauses
// between them end within `timeout` on `clock` (which times the budget and
// the pauses, common/base/clock.h), and one attempt may take all of it. An
// unreachable daemon (UNAVAILABLE) is asked again after CallWithRetry's
// doubling, jittered pause from 50 ms up to 2 s while the budget lasts; a
// daemon that does not answer gets one attempt, ended by its real-time
// gRPC deadline. `clock` outlives the policy's use.
rpc::RetryPolicy CommandRetryPolicy(absl::Duration timeout,
                                    Clock* clock = RealClock());

// GetClusterStatus of the coordinator at `coordinator` (host:port), under
// `policy`; the error names the RPC and the attempts made.
absl::Status GetClusterStatus(const std::string& coordinator,
                              const rpc::TlsOptions& tls,
                              const rpc::RetryPolicy& policy,
                              tandem::v1::GetClusterStatusResponse* response);

// The rollout worker at `address` (host:port): `action` is one of status,
// pause, resume, drain (pause and drain give the reason "tandemctl"),
// under `policy`. The error names "worker <action>" and the attempts made;
// an unknown action is InvalidArgument, naming it.
absl::Status CallWorker(const std::string& action, const std::string& address,
                        const rpc::TlsOptions& tls,
                        const rpc::RetryPolicy& policy,
                        tandem::v1::RolloutStatus* response);

}  // namespace tandem::ctl
