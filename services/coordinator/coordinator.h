#pragma once

// The coordinator daemon: cluster membership (registration, heartbeats,
// expiry of silent members), the prompt stream and its leases, sample
// intake and scoring by verifier members, training batches under the
// staleness bound, and policy versions. WatchCluster streams push every
// new policy version and broadcast epoch to members and observers
// (ClusterWatchers), so they need not poll.
//
// Threads: gRPC reactors only touch in-memory state under short locks and
// never wait; PullTrainingBatch calls that must wait for ready groups are
// parked and finished later by the scoring threads (when a group becomes
// ready) or the maintenance loop (at their deadline). The maintenance loop
// also expires members, leases and uncommitted batches, flushes and
// compacts the journal, and refreshes metrics. Scoring calls run on the
// ScoringDispatcher's threads; commits and publishes, which sync the
// journal, run on a small pool.

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/daemon/daemon_runtime.h"
#include "services/coordinator/broadcast_epochs.h"
#include "services/coordinator/cluster_watchers.h"
#include "services/coordinator/coordinator_authz.h"
#include "services/coordinator/coordinator_config.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/group_ledger.h"
#include "services/coordinator/member_registry.h"
#include "services/coordinator/scoring_dispatcher.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::coordinator {

class Coordinator : public tandem::v1::Coordinator::CallbackService {
 public:
  // `clock` times lease expiry, member heartbeat timeouts, scoring
  // backoffs and broadcast epochs (common/base/clock.h); it outlives the
  // coordinator.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const CoordinatorConfig& config, Clock* clock = RealClock());
  ~Coordinator() override;

  // Starts the maintenance loop and the scoring threads and marks the
  // daemon ready.
  absl::Status Start();
  // Health NOT_SERVING, refuses new work with UNAVAILABLE, answers parked
  // pulls, lets in-flight calls finish within `deadline`, then stops.
  void GracefulStop(absl::Duration deadline);
  // Stops at once. Idempotent.
  void Stop();

  const std::string& grpc_address() const { return runtime_->grpc_address(); }
  // The /metrics text of this coordinator's registry.
  std::string MetricsTextForTest() const;

  // tandem.v1.Coordinator
  grpc::ServerUnaryReactor* Register(
      grpc::CallbackServerContext* context,
      const tandem::v1::RegisterRequest* request,
      tandem::v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(
      grpc::CallbackServerContext* context,
      const tandem::v1::HeartbeatRequest* request,
      tandem::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(
      grpc::CallbackServerContext* context,
      const tandem::v1::DeregisterRequest* request,
      tandem::v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* LeasePrompts(
      grpc::CallbackServerContext* context,
      const tandem::v1::LeasePromptsRequest* request,
      tandem::v1::LeasePromptsResponse* response) override;
  grpc::ServerUnaryReactor* RenewLeases(
      grpc::CallbackServerContext* context,
      const tandem::v1::RenewLeasesRequest* request,
      tandem::v1::RenewLeasesResponse* response) override;
  grpc::ServerUnaryReactor* ReturnLeases(
      grpc::CallbackServerContext* context,
      const tandem::v1::ReturnLeasesRequest* request,
      tandem::v1::ReturnLeasesResponse* response) override;
  grpc::ServerUnaryReactor* SubmitSamples(
      grpc::CallbackServerContext* context,
      const tandem::v1::SubmitSamplesRequest* request,
      tandem::v1::SubmitSamplesResponse* response) override;
  grpc::ServerUnaryReactor* PullTrainingBatch(
      grpc::CallbackServerContext* context,
      const tandem::v1::PullTrainingBatchRequest* request,
      tandem::v1::PullTrainingBatchResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseTrainingBatch(
      grpc::CallbackServerContext* context,
      const tandem::v1::ReleaseTrainingBatchRequest* request,
      tandem::v1::ReleaseTrainingBatchResponse* response) override;
  grpc::ServerUnaryReactor* CommitTrainingBatch(
      grpc::CallbackServerContext* context,
      const tandem::v1::CommitTrainingBatchRequest* request,
      tandem::v1::CommitTrainingBatchResponse* response) override;
  grpc::ServerUnaryReactor* PublishPolicyVersion(
      grpc::CallbackServerContext* context,
      const tandem::v1::PublishPolicyVersionRequest* request,
      tandem::v1::PublishPolicyVersionResponse* response) override;
  grpc::ServerUnaryReactor* ResumeTraining(
      grpc::CallbackServerContext* context,
      const tandem::v1::ResumeTrainingRequest* request,
      tandem::v1::ResumeTrainingResponse* response) override;
  grpc::ServerUnaryReactor* GetClusterStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetClusterStatusRequest* request,
      tandem::v1::GetClusterStatusResponse* response) override;
  // Snapshot, then events (cluster_watchers.h). An unknown non-empty
  // member_id gets NOT_FOUND; an empty one watches as an observer.
  grpc::ServerWriteReactor<tandem::v1::ClusterEvent>* WatchCluster(
      grpc::CallbackServerContext* context,
      const tandem::v1::WatchClusterRequest* request) override;
  // Weight broadcast membership: members report here and poll it when a
  // WatchCluster event (or their fallback interval) says to.
  grpc::ServerUnaryReactor* SyncWeightGroup(
      grpc::CallbackServerContext* context,
      const tandem::v1::SyncWeightGroupRequest* request,
      tandem::v1::SyncWeightGroupResponse* response) override;

 private:
  // A PullTrainingBatch call waiting for ready groups.
  struct ParkedPull {
    grpc::ServerUnaryReactor* reactor;
    const tandem::v1::PullTrainingBatchRequest* request;
    tandem::v1::PullTrainingBatchResponse* response;
    absl::Time deadline;
    uint32_t dropped = 0;
    absl::Time parked_at;  // for tandem_coordinator_trainer_wait_seconds_total
  };

  Coordinator(const CoordinatorConfig& config, Clock* clock);
  // OK when every field of `request` is within its size limit
  // (request_limits.h); else INVALID_ARGUMENT naming the field, counted
  // for `rpc`.
  grpc::Status CheckLimits(const char* rpc,
                           const google::protobuf::Message& request);
  // With tls.mode mtls: OK when the caller's certificate may call `method`
  // naming `member_id` (the table in coordinator_authz.h; an empty id names
  // no member), and for Register, when its role is `register_as`'s.
  // Otherwise UNAUTHENTICATED (no identity) or PERMISSION_DENIED (wrong
  // role, another identity's member id), counted and logged. `owner`, when
  // set, receives the caller's identity (its SPIFFE ID). With tls.mode off:
  // OK, and `owner` is empty.
  grpc::Status Authorize(
      CoordinatorRpc method, const grpc::ServerContextBase& context,
      const std::string& member_id, std::string* owner = nullptr,
      tandem::v1::Role register_as = tandem::v1::ROLE_UNSPECIFIED);
  // The prelude of a handler: Authorize(method, context, member_id, owner,
  // register_as), then CheckLimits(request) under the RPC's name in the
  // access table (coordinator_authz.h). The first refusal, or OK.
  grpc::Status Admit(
      CoordinatorRpc method, const grpc::ServerContextBase& context,
      const std::string& member_id, const google::protobuf::Message& request,
      std::string* owner = nullptr,
      tandem::v1::Role register_as = tandem::v1::ROLE_UNSPECIFIED);
  void MaintenanceLoop();
  // Forms the re-send epoch after a failed broadcast when due
  // (BroadcastEpochs::Regroup) and logs it.
  void Regroup(absl::Time now);
  // Pushes `group` to the watchers when it is a formed epoch.
  void AnnounceEpoch(const tandem::v1::BroadcastGroup& group);
  void UpdateMemberGauges();
  // The data-plane secret (coordinator_data_plane.cc; proto
  // DataPlaneSecret): a new one with the next epoch when a member leaves;
  // handed to trainer and rollout members only, with tls.mode mtls only.
  void RotateDataPlaneSecret(const std::string& why);
  void FillDataPlaneSecret(tandem::v1::Role role,
                           tandem::v1::DataPlaneSecret* out);
  void UpdateWorkMetrics();
  // Tries every parked pull; finishes those served, past their deadline, or
  // all of them when `finish_all`.
  void ServeParkedPulls(bool finish_all);
  // ServeParkedPulls(false) on sync_pool_, the thread that parks pulls.
  void PostServeParkedPulls();
  // For the RPCs that sync the journal, which never runs on a reactor:
  // runs `work` on sync_pool_, finishes the call with the status it
  // returns, then runs `then` (when set) on the same thread.
  grpc::ServerUnaryReactor* FinishOffReactor(
      grpc::CallbackServerContext* context, std::function<grpc::Status()> work,
      std::function<void()> then = nullptr);
  // Tries one pull; true when it has groups (the response is filled).
  bool TryPull(const tandem::v1::PullTrainingBatchRequest& request,
               tandem::v1::PullTrainingBatchResponse* response,
               uint32_t* dropped);

  const CoordinatorConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  CoordinatorMetrics metrics_;
  MemberRegistry members_;
  // Weight broadcast group as membership epochs (trainer + caught-up
  // rollout workers); changes only when a version is published.
  std::unique_ptr<BroadcastEpochs> epochs_;
  std::unique_ptr<WeightSyncGauges> weight_sync_gauges_;
  std::unique_ptr<GroupLedger> ledger_;
  GrpcVerifierClient verifier_client_;
  std::unique_ptr<ScoringDispatcher> scoring_;
  // Declared before runtime_: its streams end before it goes.
  std::unique_ptr<ClusterWatchers> watchers_;
  std::unique_ptr<daemon::DaemonRuntime> runtime_;
  Clock* const clock_;
  const absl::Time started_;  // on clock_

  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> members_expired_{0};
  // Guards stop_maintenance_, which ends the maintenance loop.
  absl::Mutex maintenance_mu_;
  bool stop_maintenance_ ABSL_GUARDED_BY(maintenance_mu_) = false;
  std::thread maintenance_thread_;
  std::atomic<bool> stopped_{false};

  absl::Mutex data_plane_mu_;
  tandem::v1::DataPlaneSecret data_plane_ ABSL_GUARDED_BY(data_plane_mu_);

  absl::Mutex pulls_mu_;
  std::vector<ParkedPull> parked_pulls_ ABSL_GUARDED_BY(pulls_mu_);
  bool pulls_closed_ ABSL_GUARDED_BY(pulls_mu_) = false;

  // Runs calls that wait on the disk (journal syncs at commits and
  // publishes), so reactors never do.
  std::unique_ptr<boost::asio::thread_pool> sync_pool_;
};

}  // namespace tandem::coordinator
