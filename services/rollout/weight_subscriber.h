#pragma once

// WeightSubscriber keeps a rollout worker on the newest published policy.
// One background thread receives each new version into a flat staging
// buffer, verifies it (CRC-32C per bucket), rebuilds it as ModelWeights and
// stages it in the StagedWeightSource; the engine then commits it at its
// next step boundary (a pointer swap), so generation never waits for a
// transfer.
//
// Transports:
//   pull       every version is pulled from the trainer's WeightServer (the
//              catch-up path: chunked, CRC-checked, resumable); the thread
//              asks the coordinator (SyncWeightGroup, broadcast = false)
//              before each pull, which names the trainer.
//   broadcast  the thread polls the coordinator (SyncWeightGroup) with what
//              it holds: when the ClusterWatcher reports an event (a new
//              version or epoch), else every watch_poll_interval (every
//              poll_interval while no WatchCluster stream is open, e.g. a
//              coordinator that does not serve it); while it is not in the
//              current broadcast group it pulls, so it catches up and the
//              coordinator adds it at the next membership epoch (with a
//              stream open, each pull waits up to watch_poll_interval for a
//              newer version, cut short by an epoch event, then polls;
//              without one it polls every 200 ms). Once listed
//              in an epoch it joins that epoch's group (of the epoch's
//              backend, gloo or nccl: CreateBroadcastGroup) and receives
//              every version the trainer broadcasts, in order (FULL, or a
//              DELTA on the version before). A failed or timed-out
//              collective leaves the group (reported to the coordinator,
//              which forms the next epoch without the dead member, and the
//              trainer re-sends the version there): for up to resend_wait
//              the worker waits for that epoch instead of pulling, then
//              falls back to pull. A version that fails verification, or a
//              delta on a version this worker does not hold, is rejected
//              (counted) after the collective and the latest version
//              pulled instead, without leaving the group. A new epoch (a
//              different key prefix) is joined when it lists this worker;
//              an epoch the worker left is never rejoined. A backend this
//              worker cannot run (FailedPrecondition: NCCL not built, no
//              CUDA device) is logged once as an error and turns broadcast
//              off for the life of the subscriber: it reports the epoch
//              failed, then broadcast = false, and pulls every version.
//
// Device go-live (a worker on a CUDA device: pull_cuda_ipc set, staged
// mode, no data-plane key): a version pulled by CUDA IPC is not read back
// to the host first. The pull receiver leaves the sink's device copy
// alone (GrpcPullReceiver handoff mode); the subscriber takes it
// (CudaIpcSink::TakeStagedCopy), verifies it on the device
// (GoLiveFromStagedTensor: CRC-32C per bucket by the device kernel, the
// finite check, the SHA-256 of the manifest that came over gRPC) and
// stages the live weights as views into that copy (converted on the
// device only when the wire dtype differs from the live dtype), so the
// engine's swap is a pointer swap with no host round trip;
// publish-to-staged is measured there. Then the host staging follows: the
// copy is read back to the host and committed there without a second
// finite check or SHA-256 (StagingWeights::CommitVerifiedElsewhere),
// while the engine may already swap; the pull receiver plans from it and
// deltas (pulled, not offered by CUDA IPC) apply to its bytes. A refusal
// is counted and logged like the host path's (rejected, and non-finite or
// digest mismatch under transport cuda_ipc), the live version stays, and
// the version is not fetched again (StagingWeights::
// RecordRefusedElsewhere).
//
// Device broadcast receive (the same worker, in an NCCL epoch:
// group->broadcasts_device_memory(); weight_subscriber_broadcast_device.cc,
// built with CUDA and NCCL only): each version is received by
// ReceiveDeviceOverBroadcast straight into a device buffer of a small pool
// (never the one the live weights view), with the group's deadlines and
// the device CRC-32C of every bucket. The buffer first gets the bytes of
// the version the host staging holds (a device copy of the last device
// go-live's flat buffer, or once, after a host delivery, a copy of the
// host staging's live bytes), so a DELTA is patched on the device onto
// that base and a FULL overwrites it. Then GoLiveFromStagedTensor
// (CRC-32C, the finite check, the SHA-256 of the TRUSTED manifest from the
// trainer's GetManifest) and the views are staged for the engine's pointer
// swap; the host staging follows (CommitVerifiedElsewhere). A refusal is
// counted like the host broadcast path's and the version is pulled (a
// non-finite one is not fetched again); the group is not left. No buffer
// free (the engine still holds them all): that version takes the host
// path. A Gloo group, inplace mode, a data-plane key or weights on the CPU:
// host staging, as before.
//
// A version whose floating-point weights hold an Inf or a NaN is refused
// by the staging's finite check, whatever the transport: the live weights
// stay, the refusal is logged and counted
// (tandem_weight_sync_nonfinite_versions_total and ..._rejected_...), and
// the next pull waits for a newer version instead of fetching it again.
//
// A version whose staged bytes do not hash to the SHA-256 of the trainer's
// manifest (StagingWeights, "Digest check") is refused on every path; for
// a broadcast the digest is fetched from the trainer's GetManifest over
// gRPC (ManifestDigestSource), not taken from the in-band manifest. The
// refusal is logged and counted (tandem_weight_sync_digest_mismatches_total
// and ..._rejected_...), and the version is pulled over gRPC like one that
// failed its CRC. A version without a digest is logged once and counted
// (tandem_weight_sync_unsigned_versions_total).
//
// Thread-safety: all public methods are thread-safe; Stop() joins (it may
// wait up to `timeout` for a rendezvous or collective under way).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/cluster/coordinator_client.h"
#include "common/model/model_config.h"
#include "common/rpc/tls_options.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/staging_weights.h"
#include "common/weights/weight_sync_metrics.h"
#include "services/rollout/received_versions.h"
#include "services/rollout/weight_update_sources.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::weights {
class GrpcPullReceiver;
struct PullStats;
class BroadcastGroup;
class BroadcastWeightReceiver;
class ManifestDigestSource;
struct BroadcastGroupConfig;
class DeviceMemory;
}  // namespace tandem::weights

namespace tandem::cluster {
class ClusterWatcher;
}  // namespace tandem::cluster

namespace tandem::rollout {

struct WeightSyncOptions {
  enum class Mode { kBroadcast, kPull };
  Mode mode = Mode::kPull;
  // How the subscriber asks the coordinator what to hold (SyncWeightGroup:
  // the latest version, the broadcast group, and the address of the
  // trainer's weight server, which is how both modes find the trainer) —
  // SyncWeightGroupVia(client) in the worker, a function of their own in
  // unit tests. Null: never asked, so nothing is received. A failed ask
  // leaves the last known trainer address in use, so a worker keeps
  // pulling while the coordinator restarts.
  std::function<grpc::Status(const tandem::v1::SyncWeightGroupRequest&,
                             tandem::v1::SyncWeightGroupResponse*)>
      sync_weight_group;
  // This worker's member id ("" while unregistered: not asked yet).
  std::function<std::string()> member_id;
  // Address Gloo binds for its pairs on this host.
  std::string bind_host = "127.0.0.1";
  // Deadline of a rendezvous and of every collective.
  absl::Duration timeout = absl::Seconds(10);
  // Broadcast mode: wakes the subscriber when the coordinator announces a
  // version or epoch (optional; must outlive the subscriber).
  cluster::ClusterWatcher* watcher = nullptr;
  // How often the coordinator is polled in broadcast mode while `watcher`
  // has a stream open (a safety net: events wake the subscriber first),
  // also by a worker outside the group, whose pull waits this long for a
  // newer version unless an epoch event ends the wait. Capped at half the
  // coordinator's weight_sync.report_timeout_ms (SyncWeightGroupResponse),
  // since a worker joins an epoch only if it reported within that time ...
  absl::Duration watch_poll_interval = absl::Seconds(1);
  // ... and while it has none (no watcher, or the stream is down), or it
  // waits for the re-send epoch after leaving a failed one; a worker
  // outside the group then pulls in 200 ms slices, polling after each.
  absl::Duration poll_interval = absl::Milliseconds(50);
  // After leaving a failed epoch, how long to wait for the coordinator's
  // next epoch (the re-send) before pulling; longer than the coordinator's
  // weight_sync.regroup_wait_ms. A newer epoch that does not list this
  // worker ends the wait at once.
  absl::Duration resend_wait = absl::Seconds(2);
  // Pulls ask for a same-host shared-memory segment (PullOptions); a
  // version copied from one is counted under transport "shm".
  bool pull_shared_memory = true;
  // Pulls ask for a version in the trainer's device memory (CUDA IPC,
  // PullOptions::cuda_ipc); null on the CPU. Must outlive the subscriber.
  weights::CudaIpcSink* pull_cuda_ipc = nullptr;
  // The key that authenticates pulls on the trainer's raw data port
  // (tls.mode mtls; set by the member session from the coordinator's
  // data-plane secret). Null: no handshake (tls.mode off).
  std::shared_ptr<const weights::DataPlaneKeyHolder> data_plane_key;
  // TLS of the gRPC pull channel to the trainer (the worker's tls section).
  rpc::TlsOptions tls;
  // Optional metrics (must outlive the subscriber).
  weights::WeightSyncMetrics* metrics = nullptr;
  // engine.update_mode inplace: receive straight into this kInplace
  // staging (InplaceWeightSource::staging(), whose gate parks the engine)
  // instead of a double buffer; nothing is staged in `source` then (which
  // may be null). A version lost half-written is replaced by pulling a
  // full copy at once (RecoverLostWeights).
  std::shared_ptr<weights::StagingWeights> inplace_staging;
  // The dtype versions arrive in (the checkpoint's, which the trainer
  // publishes); unset = the live weights' dtype. A version received in
  // another dtype than the live weights', or for weights on a GPU, is
  // converted and moved to the live weights' dtype and device on this
  // thread before it is staged, so the engine's swap stays a pointer swap.
  std::optional<model::WeightDType> wire_dtype;
  // Times poll_interval without a watcher, the retry pauses after a failed
  // pull, resend_wait, and a pull's wait for a newer version (the deadline
  // of ReceiveNext, so also a worker outside the group's wait between two
  // reports to the coordinator): the pull receiver runs on this clock
  // (PullOptions::clock), whose gRPC and socket deadlines and transfers
  // stay real time. Must outlive the subscriber.
  Clock* clock = RealClock();
  // Test-only seams of the device broadcast receive (see the header):
  // groups come from `create_group_for_test` instead of
  // CreateBroadcastGroup, and `device_memory_for_test` stands in for the
  // CUDA device (host memory; it turns the device receive on for weights
  // on the CPU). Null in production.
  std::function<absl::StatusOr<std::unique_ptr<weights::BroadcastGroup>>(
      const weights::BroadcastGroupConfig&)>
      create_group_for_test;
  weights::DeviceMemory* device_memory_for_test = nullptr;
};

// WeightSyncOptions::sync_weight_group through the coordinator client (each
// call with a 2 s deadline). `coordinator` must outlive the subscriber.
std::function<grpc::Status(const tandem::v1::SyncWeightGroupRequest&,
                           tandem::v1::SyncWeightGroupResponse*)>
SyncWeightGroupVia(cluster::CoordinatorClient* coordinator);

class WeightSubscriber {
 public:
  // `model` is the worker's decoder (its live weights define the layout
  // every version must have).
  static absl::StatusOr<std::unique_ptr<WeightSubscriber>> Create(
      std::shared_ptr<model::DecoderModel> model, StagedWeightSource* source,
      uint64_t live_version, WeightSyncOptions options);
  ~WeightSubscriber();

  void Start();
  void Stop();

  uint64_t received_version() const;
  uint64_t versions_received() const;
  WeightSyncStatus sync_status() const;

  // The engine made `version` live: records publish-to-live seconds for a
  // version this subscriber delivered. Cheap; any thread.
  void RecordLive(uint64_t version);

 private:
  // The coordinator's answer to one poll.
  struct ClusterView {
    uint64_t policy_version = 0;
    tandem::v1::BroadcastGroup group;
    std::string weight_server_address;
  };

  explicit WeightSubscriber(uint64_t live_version);

  // The loop and the coordinator (weight_subscriber.cc).
  void Run();
  bool stopping() const;
  // Waits for the next reason to poll the coordinator: a cluster event, or
  // the poll interval that applies (see WeightSyncOptions); `recovering`
  // (just left a failed epoch) always uses the short poll_interval.
  void WaitForCluster(bool recovering = false);
  // Reports to the coordinator and reads the current group and the
  // trainer's address (remembered in trainer_address_). False when the
  // coordinator could not be asked (the caller pulls meanwhile, from the
  // last known trainer).
  bool Poll(ClusterView* view);
  // watch_poll_interval, capped at half the coordinator's report timeout.
  absl::Duration WatchInterval() const;
  // This worker's rank in `group`, or -1.
  int RankIn(const tandem::v1::BroadcastGroup& group) const;
  // Just left a failed epoch that `view` still lists: the coordinator is
  // forming the next one, where the trainer re-sends the version.
  bool AwaitingResend(const ClusterView& view) const;

  // Broadcast receive path (weight_subscriber_broadcast.cc): joins
  // `view.group` if needed and receives one version when the trainer has
  // published one this worker has not seen.
  void BroadcastStep(const ClusterView& view, int rank);
  // Joins the epoch of `group` as `rank`; false when it could not (the
  // epoch is abandoned).
  bool JoinEpoch(const tandem::v1::BroadcastGroup& group, int rank);
  // Receives the next version of the joined epoch's stream.
  void ReceiveBroadcast(const tandem::v1::BroadcastGroup& group);
  // A broadcast version that failed verification, or a delta on a version
  // this worker does not hold: counted and pulled instead.
  void RejectBroadcast(uint64_t version, const absl::Status& why);
  // Device broadcast receive (weight_subscriber_broadcast_device.cc; see
  // the header). Whether the joined group's versions go to device memory;
  // makes the live weights' CUDA device current (the NCCL group's device).
  bool UseDeviceBroadcast();
  // Receives the next version into a device buffer and stages it; false
  // when it could not start (no free buffer): the host path takes it.
  bool ReceiveBroadcastOnDevice(const tandem::v1::BroadcastGroup& group);
  // Selects the live weights' CUDA device on this thread (before an NCCL
  // group is created); a no-op on the CPU or without CUDA.
  void SelectLiveDevice();
  void LeaveGroup();
  // Leaves the group after a failed rendezvous or collective and queues
  // the failure report.
  void AbandonGroup(const std::string& why);

  // Pull path (weight_subscriber_pull.cc).
  // How long a pull outside the broadcast group waits for a newer version
  // before the coordinator is asked again (see WeightSyncOptions).
  absl::Duration PullWait(bool broadcast) const;
  // Ends a pull's wait for a newer version (never a transfer); called by
  // the watcher on an epoch event and when its stream opens or ends.
  void InterruptPullWait();
  // Pull path: waits until `deadline` (on options_.clock) for a version
  // newer than the staged one from the trainer at `address`; stages it.
  void PullOnce(const std::string& address, absl::Time deadline);
  // The receiver for `address` (a new one when the trainer moved); false
  // when stopping.
  bool EnsurePullReceiver(const std::string& address);
  // Device go-live (weight_subscriber_device.cc): `manifest`'s version,
  // which the pull receiver left in the CUDA IPC sink, is verified where it
  // lies and staged for the engine as views into that copy; then the host
  // staging follows. The refusal (counted in the staging's stats) or OK.
  absl::Status GoLiveOnDevice(const v1::WeightManifest& manifest,
                              weights::SyncTransport transport,
                              absl::Time started);
  // Counts the shared-memory fallbacks of one pull.
  void RecordShmFallbacks(const weights::PullStats& before,
                          const weights::PullStats& after);
  // Inplace mode: the live buffer was overwritten by a version that did
  // not verify (or broke off); the engine stays parked until this pulls a
  // full copy of the latest version.
  void RecoverLostWeights();

  // Swap bookkeeping (weight_subscriber_delivery.cc).
  // Counts (metric, log) the versions the staging refused for non-finite
  // values since its stats showed `before`.
  void CountNonFinite(uint64_t before, weights::SyncTransport transport);
  // Counts (metric, log) the versions the staging refused for a SHA-256
  // mismatch, or verified without a digest (logged once), since its stats
  // showed `before`; `result` is the receive's outcome.
  void CountDigestChecks(const weights::StagingStats& before,
                         weights::SyncTransport transport,
                         const absl::Status& result);
  // Commits the received version in staging and hands it to the engine.
  void Deliver(uint64_t version, weights::SyncTransport transport,
               absl::Time started, uint64_t bytes_before);
  // Commits the staging; the weights for the engine in the live weights'
  // dtype and device (null in inplace mode: the commit released the
  // engine).
  absl::StatusOr<std::shared_ptr<model::ModelWeights>> CommitStaging();
  // The received-version metrics of a version staged at `staged`.
  void RecordReceived(const v1::WeightManifest& manifest,
                      weights::SyncTransport transport, absl::Time started,
                      absl::Time staged, uint64_t bytes_before);

  std::shared_ptr<model::DecoderModel> model_;
  // The live config with the dtype versions arrive in.
  model::ModelConfig wire_config_;
  StagedWeightSource* source_ = nullptr;
  // The trainer's weight server, as the coordinator last said (subscriber
  // thread only).
  std::string trainer_address_;
  WeightSyncOptions options_;
  std::shared_ptr<weights::StagingWeights> staging_;
  // Versions pulled by CUDA IPC go live from the sink's device copy
  // (options_.pull_cuda_ipc hands copies over, staged mode, no data-plane
  // key); set by Create.
  bool device_go_live_ = false;
  bool device_live_logged_ = false;  // the first device go-live was logged
  ReceivedVersions received_;
  std::thread thread_;

  // Receiver thread only.
  std::string pull_address_;
  std::unique_ptr<weights::GrpcPullReceiver> pull_;
  std::unique_ptr<weights::BroadcastGroup> group_;
  std::unique_ptr<weights::BroadcastWeightReceiver> group_receiver_;
  // The digest each broadcast version is checked against, from the
  // trainer's GetManifest over gRPC (not the in-band manifest).
  std::unique_ptr<weights::ManifestDigestSource> broadcast_digests_;
  bool unsigned_logged_ = false;  // a version without a digest was logged
  // The device broadcast pool and the last device go-live's flat buffer
  // (weight_subscriber_broadcast_device.cc); null until first used.
  struct DeviceBroadcast;
  std::shared_ptr<DeviceBroadcast> device_broadcast_;
  // Not OK: this worker cannot run the coordinator's backend; it pulls.
  absl::Status broadcast_off_;
  std::string joined_prefix_;
  std::string abandoned_prefix_;
  absl::Time abandoned_at_ = absl::InfinitePast();  // on options_.clock
  uint64_t stream_version_ = 0;     // last version of the group's stream seen
  bool received_in_epoch_ = false;  // a version was delivered in this epoch
  uint64_t failed_epoch_ = 0;       // to report once
  std::string failure_;
  // The coordinator's report timeout (last SyncWeightGroupResponse); zero
  // until told.
  absl::Duration report_timeout_ = absl::ZeroDuration();

  // What Stop() interrupts: the pull receiver's wait and the collective
  // under way.
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  weights::GrpcPullReceiver* receiver_ ABSL_GUARDED_BY(mu_) = nullptr;
  weights::BroadcastGroup* active_group_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace tandem::rollout
