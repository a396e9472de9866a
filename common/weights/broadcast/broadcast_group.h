#pragma once

// BroadcastGroup: what the trainer's BroadcastSender and a rollout worker's
// WeightSubscriber need from one membership epoch's collective group,
// whatever its backend (tandem.v1.BroadcastGroup.backend):
//   "gloo"  GlooBroadcastGroup (gloo_broadcast_transport.h), CPU, always
//           built with LibTorch;
//   "nccl"  NcclBroadcastGroup (nccl_broadcast_transport.h), GPU, built
//           only with TANDEM_ENABLE_NCCL.
// CreateBroadcastGroup() picks the implementation from the backend the
// coordinator handed out, so every member of an epoch runs the same one.
//
// FailedPrecondition from CreateBroadcastGroup() means this member cannot
// run the backend at all (not compiled in, no CUDA device): a later epoch
// would fail the same way, so callers stop taking part in broadcast and
// receive by pull instead (broadcast_sender.h, weight_subscriber.h). The
// message starts with "weight_sync.backend '<name>': " and names the cause.
//
// The per-version wire protocol on top of a group is the same for every
// backend (broadcast_protocol.h): BroadcastWeightSender on rank 0,
// BroadcastWeightReceiver on the other ranks.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/broadcast_protocol.h"
#include "common/weights/weight_transport.h"

namespace tandem::weights {

class GlooRendezvousStore;
class RendezvousKeyspace;

// BroadcastGroup.store_address of an epoch whose rendezvous goes through
// the trainer's gRPC Rendezvous service (tls.mode mtls) rather than a
// TCPStore: members reach it at the trainer's weight-server address.
inline constexpr char kGrpcRendezvousAddress[] = "grpc:trainer";

class BroadcastGroup {
 public:
  virtual ~BroadcastGroup() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // A collective failed, timed out or Abort() was called: later collectives
  // fail fast; the coordinator forms the next epoch.
  virtual bool broken() const = 0;

  // Broadcasts `bytes` from rank 0 into every rank's `bytes`, in place.
  // REQUIRES: size a multiple of 4, data 4-byte aligned. Errors mark the
  // group broken.
  virtual absl::Status Broadcast(absl::Span<uint8_t> bytes) = 0;

  // Starts Broadcast(bytes) and returns its completion: calling it blocks
  // until the bytes are in place and returns Broadcast's status (call it
  // exactly once, before `bytes` is touched or the next broadcast starts).
  // A receiver verifies one bucket while the next arrives this way. This
  // default broadcasts before returning; Gloo returns at once and moves the
  // bytes on its own thread.
  virtual std::function<absl::Status()> StartBroadcast(
      absl::Span<uint8_t> bytes) {
    absl::Status status = Broadcast(bytes);
    return [status] { return status; };
  }

  // Whether BroadcastDevice() can move device memory: true for NCCL, false
  // for Gloo (a CPU backend). Senders and receivers check it before the
  // first broadcast of a version, so that no rank refuses half way through
  // one (broadcast/device_broadcast.h).
  virtual bool broadcasts_device_memory() const { return false; }

  // Broadcasts `bytes` bytes of CUDA device memory at `device_ptr` from rank
  // 0 into every rank's region, in place, with no host round trip. The
  // region is cut into collectives exactly as Broadcast() cuts a host span
  // of the same size, so one rank may send from device memory while
  // another receives into host memory. REQUIRES: `bytes` a multiple of 4,
  // `device_ptr` 4-byte aligned memory of this rank's device; on rank 0 the
  // bytes are complete (the stream that wrote them was synchronised). On
  // return the bytes are in place. Errors mark the group broken like
  // Broadcast()'s, except refusals that send nothing: this default (Gloo)
  // returns FailedPrecondition "... cannot broadcast device memory ..."
  // and leaves the group as it was. Copying through pinned host memory is
  // the caller's choice (it knows its stream); the group does not do it
  // behind its back.
  virtual absl::Status BroadcastDevice(void* device_ptr, uint64_t bytes);

  // Marks the group broken and interrupts a collective under way, which
  // then fails at once instead of at its deadline (Gloo fails the group's
  // connections, NCCL aborts the communicator); later collectives fail
  // fast. May be called from any thread while the group lives.
  virtual void Abort() = 0;

  // Rank 0 sends FULL buckets in pieces of at most this many bytes
  // (broadcast_protocol.h); 0: whole buckets.
  virtual uint64_t piece_bytes() const { return 0; }
};

// Rank 0's WeightSender. `group` must outlive it.
class BroadcastWeightSender : public WeightSender {
 public:
  // `keys` (tls.mode mtls): every version is sealed with its current key
  // (broadcast_protocol.h); null: plaintext. Outlives this sender.
  explicit BroadcastWeightSender(BroadcastGroup* group,
                                 const DataPlaneKeyHolder* keys = nullptr)
      : group_(group), keys_(keys) {}
  // `deadline` is not used: each collective carries the group's timeout.
  absl::Status Publish(const v1::WeightManifest& manifest,
                       absl::Span<const uint8_t> payload,
                       absl::Time deadline) override;

 private:
  BroadcastGroup* group_;
  const DataPlaneKeyHolder* keys_;
};

// A worker rank's WeightReceiver. `group` must outlive it.
class BroadcastWeightReceiver : public WeightReceiver {
 public:
  explicit BroadcastWeightReceiver(BroadcastGroup* group) : group_(group) {}
  absl::StatusOr<uint64_t> ReceiveNext(StagingWeights* staging,
                                       absl::Time deadline) override;
  // Aborts the group.
  void Cancel() override { group_->Abort(); }

  // The policy version of the last round this receiver took part in (its
  // manifest arrived), whether or not the version could be staged: the
  // sender's stream position. 0 before the first round.
  uint64_t last_round_version() const { return last_round_version_; }

  // Where the SHA-256 of each received version is taken from (the
  // authenticated plane) instead of the in-band manifest. REQUIRES: set
  // before ReceiveNext; outlives this receiver. Null: the in-band one.
  void set_trusted_digests(TrustedDigestSource* trusted) { trusted_ = trusted; }

  // The keys sealed versions are opened with (tls.mode mtls); only sealed
  // versions are accepted then. Null (tls.mode off): only plain ones.
  // REQUIRES: set before ReceiveNext; outlives this receiver.
  void set_data_plane_keys(const DataPlaneKeyHolder* keys) { keys_ = keys; }
  // How the last round was sealed, and whether it failed to open.
  const BroadcastSealOutcome& last_seal() const { return last_seal_; }

 private:
  BroadcastGroup* group_;
  TrustedDigestSource* trusted_ = nullptr;
  const DataPlaneKeyHolder* keys_ = nullptr;
  BroadcastSealOutcome last_seal_;
  uint64_t last_round_version_ = 0;
};

// One member's view of an epoch's group. The Gloo group takes it as it is
// (GlooGroupConfig); the NCCL one adds device settings (NcclGroupConfig).
struct BroadcastGroupConfig {
  // BroadcastGroup.backend: "gloo" (also for ""), or "nccl".
  std::string backend = "gloo";
  // The trainer's rendezvous store (BroadcastGroup.store_address).
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  // When set, the rendezvous goes through this keyspace instead of the
  // TCPStore at store_host:store_port (which is then not used): the
  // trainer's in-process RendezvousKeys for rank 0, a RendezvousClient of
  // the trainer's gRPC Rendezvous service for the others (mTLS clusters;
  // rendezvous_keys.h). The epoch's scope is key_prefix.
  std::shared_ptr<RendezvousKeyspace> rendezvous;
  // BroadcastGroup.key_prefix.
  std::string key_prefix = "tandem/weights/epoch0";
  int rank = 0;
  int world_size = 1;
  // Gloo: address it binds for its pairs on this host.
  std::string bind_host = "127.0.0.1";
  // Deadline of the rendezvous and of every collective.
  absl::Duration timeout = absl::Seconds(30);
  // Gloo rank 0: FULL buckets go in pieces of at most this many bytes, so
  // that a receiver checksums each piece while it is still in cache (and
  // while the next arrives); 0 sends whole buckets. Receivers follow the
  // sender. Whole buckets by default: on the test machine every Gloo
  // collective's fixed cost outweighed the warmer checksum (4 MiB pieces
  // 0.65-0.68 of a socket copy, 16 MiB 0.73-0.76, whole 64 MiB buckets
  // 0.86-0.88; docs/benchmarks.md, weights_transport_bench --piece-kib).
  // NCCL sends whole buckets.
  uint64_t piece_bytes = 0;
  // When set (by another thread) during CreateBroadcastGroup, the
  // rendezvous ends early with Cancelled: how a stopping member leaves a
  // rendezvous whose peers never come. Must outlive CreateBroadcastGroup.
  const std::atomic<bool>* cancelled = nullptr;
};

// Whether this build has the transport of `backend` ("" counts as gloo).
bool BroadcastBackendBuilt(absl::string_view backend);

// Joins the group with the backend's implementation; blocks for the
// rendezvous (at most config.timeout). Gloo's rank 0 uses `server` (the
// store it hosts; see GlooBroadcastGroup::Create); NCCL ranks connect to
// store_host:store_port as clients and ignore it. FailedPrecondition when
// this member cannot run the backend (see the top of this file);
// otherwise the backend's own errors.
absl::StatusOr<std::unique_ptr<BroadcastGroup>> CreateBroadcastGroup(
    const BroadcastGroupConfig& config,
    const GlooRendezvousStore* server = nullptr);

// Rank 0 cannot run the epoch's backend (`reason`: CreateBroadcastGroup's
// FailedPrecondition): tells the other ranks where the backend allows it,
// so they fail at once with FailedPrecondition instead of waiting for the
// rendezvous deadline (NCCL: NcclRefuseGroup). Gloo, or a build without
// NCCL: nothing to do (OK).
absl::Status RefuseBroadcastGroup(const BroadcastGroupConfig& config,
                                  absl::string_view reason);

}  // namespace tandem::weights
