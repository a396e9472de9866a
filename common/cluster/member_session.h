#pragma once

// MemberSession keeps one daemon registered with the coordinator: it
// registers (retrying with backoff while the coordinator is unreachable),
// heartbeats at the interval the coordinator asks for, and registers again
// by itself when the coordinator has forgotten it (declared dead, or
// restarted). Thread-safe; one background thread, joined by Stop().

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/cluster/coordinator_client.h"
#include "common/rpc/tls_options.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::cluster {

struct MemberSessionOptions {
  std::string coordinator_address;
  // TLS of the channel to the coordinator (the daemon's tls section).
  rpc::TlsOptions tls;
  tandem::v1::Role role = tandem::v1::ROLE_UNSPECIFIED;
  std::string grpc_address;
  std::string metrics_address;
  std::map<std::string, std::string> capabilities;
  // Deadline of each Register/Heartbeat/Deregister call.
  absl::Duration rpc_timeout = absl::Seconds(3);
  // Longest wait between registration attempts.
  absl::Duration max_backoff = absl::Seconds(2);
  // Told each new data-plane secret the coordinator hands out (in
  // Register and Heartbeat responses; tls.mode mtls, trainer and rollout
  // members only), with the heartbeat interval the coordinator asks for
  // (how long peers may still use the previous secret depends on it), from
  // the session thread. Optional.
  std::function<void(const tandem::v1::DataPlaneSecret&,
                     absl::Duration heartbeat_interval)>
      on_data_plane_secret;
  // Times the heartbeat interval and the registration backoff (not the
  // calls' gRPC deadlines). Outlives the session.
  Clock* clock = RealClock();
};

class MemberSession {
 public:
  // Fills state, policy version and load into each heartbeat. Called from
  // the session thread; must be thread-safe with respect to the daemon.
  using HeartbeatFiller = std::function<void(tandem::v1::HeartbeatRequest*)>;

  MemberSession(MemberSessionOptions options, HeartbeatFiller filler);
  ~MemberSession();
  MemberSession(const MemberSession&) = delete;
  MemberSession& operator=(const MemberSession&) = delete;

  // Starts the background thread. Call once.
  void Start();
  // Stops heartbeating; when `deregister` and registered, tells the
  // coordinator (one attempt, rpc_timeout). Idempotent.
  void Stop(bool deregister, const std::string& reason);

  // Empty until the first successful registration.
  std::string member_id() const;
  bool registered() const;
  // Latest policy version the coordinator reported.
  uint64_t cluster_policy_version() const;
  // The session's channel to the coordinator, for every call the daemon
  // makes (the session's own Register/Heartbeat/Deregister go through it
  // too). Lives as long as the session.
  CoordinatorClient* client() { return client_.get(); }

 private:
  void Run();
  bool TryRegister();
  void Heartbeat();

  const MemberSessionOptions options_;
  const HeartbeatFiller filler_;
  const std::unique_ptr<CoordinatorClient> client_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string member_id_ ABSL_GUARDED_BY(mu_);
  std::string previous_member_id_ ABSL_GUARDED_BY(mu_);
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  uint64_t cluster_policy_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Session thread only: the epoch of the last secret passed on.
  uint64_t data_plane_epoch_ = 0;
  void TakeDataPlaneSecret(const tandem::v1::DataPlaneSecret& secret);
};

}  // namespace tandem::cluster
