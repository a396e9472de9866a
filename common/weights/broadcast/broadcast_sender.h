#pragma once

// BroadcastSender: the trainer's side of weight broadcast. It hosts the
// rendezvous store (a c10d TCPStore) for every membership epoch and, on its
// own thread, broadcasts each queued version to the group the coordinator
// assigned to it (rank 0 of a group of the group's backend, gloo or nccl:
// CreateBroadcastGroup in broadcast_group.h), so training never waits for
// a transfer.
//
// Per job: a group with no receivers is skipped (and the previous group
// left). When the job's epoch (key prefix) differs from the current one,
// the old group is destroyed and the new one formed (rendezvous with the
// deadline); an epoch once left is never formed again (its queued jobs are
// dropped). A failed rendezvous or collective aborts and destroys the
// group, so survivors blocked in it fail fast; the rest of that epoch's
// jobs are dropped, and the outcome is reported to the listener, which
// tells the coordinator. The coordinator then forms the next epoch without
// the dead member and the listener hands the version back with Resend(),
// which is sent first (always FULL).
//
// A backend this trainer cannot run (FailedPrecondition from
// CreateBroadcastGroup: NCCL not built, no CUDA device) turns broadcast off
// for the life of the sender: that rendezvous failure is reported once
// like any other (the coordinator marks the epoch failed), and every later
// job is dropped without a rendezvous or a report, so rollout workers
// receive every version by pull. The receivers of that epoch and of every
// later one are told through the store (RefuseBroadcastGroup), so NCCL
// workers that could run it fail at once rather than at the rendezvous
// deadline. unavailable() returns the reason.
//
// Queued jobs of one epoch are coalesced: a job is skipped when a job of
// the same epoch with the same or a newer version waits behind it, and a
// version not newer than the last one sent to the epoch is not sent again;
// the last version of every epoch is always sent, because receivers of
// that epoch wait for it.
//
// FULL or DELTA: a job may carry a delta on v-1 besides the full copy. The
// delta is sent only when every receiver of the epoch is known to hold
// v-1: v-1 is the last version this epoch delivered, or v is the epoch's
// first_policy_version and the epoch before ended cleanly having delivered
// v-1 or with no receivers (the coordinator admits a new member only when
// it holds v-1, and keeps members of the epoch before). After a coalesced
// or skipped version, a failure or a re-send, the version goes FULL. A
// receiver that still lacks the base takes part in the collective and
// rejects the delta.
//
// Stopping (c10d's shutdown() then abort()): Stop(drain) refuses new jobs,
// drops the queued ones, lets a job under way finish for at most `drain`,
// then cancels its rendezvous and aborts its group (BroadcastGroup::Abort
// interrupts the collective: the receivers' collectives fail at once too)
// and joins the sender thread. It returns within `drain` plus the time a
// collective takes to notice the abort, never at the collective's own
// deadline, and never leaves a thread behind: after Stop() returns the
// listener is not called again.
//
// From device memory (issue 22 item 4): a job may carry its FULL
// version's device copy (Enqueue's `full_device`). SendPayload sends it
// with options.device_publish (PublishDeviceOverBroadcast of
// device_broadcast.h in the trainer) when the group broadcasts device
// memory (NCCL), the version is not sealed (no data_plane_key) and the
// payload sent is the FULL one; a DELTA, a Gloo group, a sealed version or
// a job without a device copy takes the host path (BroadcastWeightSender).
// Both send the same protocol, so receivers cannot tell them apart.
//
// Thread-safety: Enqueue() and Resend() from any thread (the listener
// included); Start/Stop from the owner, not from the listener.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/rendezvous_keys.h"
#include "common/weights/delta_publisher.h"
#include "common/weights/weight_store.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

// Sends a FULL version from `bytes` bytes of device memory at d_payload as
// rank 0 of `group`: PublishDeviceOverBroadcast (device_broadcast.h).
using DevicePublish = std::function<absl::Status(
    BroadcastGroup* group, const v1::WeightManifest& manifest,
    const uint8_t* d_payload, uint64_t bytes)>;

struct BroadcastSenderOptions {
  // Host the rendezvous store listens on and that workers connect to.
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;  // 0 picks a free port
  // Address Gloo binds for its pairs.
  std::string bind_host = "127.0.0.1";
  // Deadline of the rendezvous and of every collective.
  absl::Duration timeout = absl::Seconds(10);
  // When set (tls.mode mtls), groups rendezvous through these keys, which
  // the trainer's gRPC Rendezvous service serves to the other members: no
  // TCPStore is started and store_host/store_port are not used. The
  // sender enters an epoch's scope when it forms the group and retires it
  // when it leaves the epoch (rendezvous_keys.h).
  std::shared_ptr<RendezvousKeys> rendezvous_keys;
  // When set (tls.mode mtls), every version is sealed with the current
  // data-plane key, and withheld while there is none (broadcast_protocol.h).
  std::shared_ptr<const DataPlaneKeyHolder> data_plane_key;
  // Null: every version goes from host bytes. Set (a CUDA trainer with
  // NCCL built): FULL versions with a device copy go from it when the
  // group broadcasts device memory and nothing is sealed (SendPayload).
  DevicePublish device_publish;
  // Runs first on the sender thread, e.g. to make the weights' CUDA device
  // current there: NCCL groups use the thread's current device. May be
  // null.
  std::function<void()> on_thread_start;
};

// How SendPayload sent a payload.
enum class SentFrom { kHost, kDevice };

// Rank 0's send of one payload of `group`: from `device` (the payload's
// bytes in device memory) through `device_publish` when `device` and
// `device_publish` are set, the payload is FULL, `keys` is null and
// group->broadcasts_device_memory(); else from payload.bytes with
// BroadcastWeightSender (deadline `deadline`). `*from` (when not null)
// says which. A device copy of the wrong size is InvalidArgument, nothing
// sent.
absl::Status SendPayload(BroadcastGroup* group, const StoredPayload& payload,
                         const DeviceFlat* device,
                         const DevicePublish& device_publish,
                         const DataPlaneKeyHolder* keys, absl::Time deadline,
                         SentFrom* from = nullptr);

// What happened to one job, for metrics and failure reports.
struct BroadcastOutcome {
  v1::BroadcastGroup group;
  uint64_t version = 0;
  bool full = true;
  bool resend = false;  // a Resend() job
  bool from_device = false;  // sent from the version's device copy
  uint64_t bytes = 0;
  double seconds = 0;
  absl::Status status;  // not OK: the group was aborted
};

class BroadcastSender {
 public:
  // Called on the sender thread after every job that was attempted.
  using Listener = std::function<void(const BroadcastOutcome&)>;

  static absl::StatusOr<std::unique_ptr<BroadcastSender>> Create(
      const BroadcastSenderOptions& options, Listener listener);
  ~BroadcastSender();

  // host:port of the rendezvous store, to advertise to the coordinator;
  // kGrpcRendezvousAddress with rendezvous_keys.
  std::string store_address() const;

  // OK, or why broadcast is off for good (a backend this trainer cannot
  // run; see the top of this file).
  absl::Status unavailable() const;

  void Start();
  // Stops (see the top of this file): a job under way gets at most `drain`
  // to finish, then it is aborted; joins the sender thread. Idempotent.
  void Stop(absl::Duration drain = absl::ZeroDuration());

  // Queues version `full` (a FULL payload) for `group`, with its DELTA on
  // v-1 when one exists (sent instead when every receiver holds v-1).
  // `full_device`: `full`'s bytes in device memory (see DeviceFlat), kept
  // alive by the job until it is sent or dropped.
  void Enqueue(const v1::BroadcastGroup& group, StoredPayload full,
               std::optional<StoredPayload> delta = std::nullopt,
               std::optional<DeviceFlat> full_device = std::nullopt);
  // The same for a FULL `manifest` + `payload`.
  void Enqueue(const v1::BroadcastGroup& group,
               const v1::WeightManifest& manifest,
               std::shared_ptr<const std::vector<uint8_t>> payload);

  // Rendezvous begun (a group about to form) and broadcasts begun (the
  // group formed, the collective about to start).
  uint64_t RendezvousStartedForTest() const { return rendezvous_started_; }
  uint64_t CollectivesStartedForTest() const { return collectives_started_; }
  // Blocks (real time, at most `timeout`) until no job is queued and none
  // is being attempted; whether that happened. Lets a test see that a job
  // was dropped without sleeping for as long as its rendezvous could take.
  bool WaitIdleForTest(absl::Duration timeout) const;

  // Queues `full` for `group` ahead of everything else: the re-send of a
  // version a failed epoch did not deliver, in the epoch formed after it.
  void Resend(const v1::BroadcastGroup& group, StoredPayload full);

 private:
  struct Job {
    v1::BroadcastGroup group;
    StoredPayload full;
    std::optional<StoredPayload> delta;
    bool resend = false;
    std::optional<DeviceFlat> full_device;
    uint64_t version() const { return full.manifest.policy_version(); }
  };

  BroadcastSender(const BroadcastSenderOptions& options, Listener listener);
  void Run();
  // Broadcasts one job on the sender thread.
  void Send(const Job& job);

  const BroadcastSenderOptions options_;
  const Listener listener_;
  std::unique_ptr<GlooRendezvousStore> store_;  // null with rendezvous_keys
  std::thread thread_;

  // This trainer's (rank 0's) view of `group`.
  BroadcastGroupConfig GroupConfig(const v1::BroadcastGroup& group) const;
  // Replaces group_ (the sender thread's), publishing it for Stop().
  void SetGroup(std::unique_ptr<BroadcastGroup> group);
  // Switches to the job's epoch (forming its group); false when the
  // rendezvous failed (reported).
  bool JoinEpoch(const Job& job, BroadcastOutcome* outcome);

  // Sender thread only.
  std::unique_ptr<BroadcastGroup> group_;
  std::string group_prefix_;
  bool group_failed_ = false;
  bool no_receivers_ = true;  // the current epoch has none (or none yet)
  uint64_t sent_ = 0;         // newest version sent to the current epoch
  // The version every receiver of the current epoch holds, when known.
  std::optional<uint64_t> holds_;
  std::deque<std::string> left_prefixes_;  // epochs never formed again

  // Set by Stop() when the drain is over: ends a rendezvous under way
  // (BroadcastGroupConfig::cancelled) and makes the thread drop its jobs.
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> rendezvous_started_{0};
  std::atomic<uint64_t> collectives_started_{0};
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The sender thread is attempting a job (Stop's drain waits for it).
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // group_ while it lives, for Stop() to abort from its thread; the sender
  // thread clears it before destroying the group.
  BroadcastGroup* active_group_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status unavailable_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
