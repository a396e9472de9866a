#pragma once

// Weight broadcast over NCCL (GPU), using the NCCL API directly (Debian's
// LibTorch has no CUDA, so no c10d ProcessGroupNCCL). Built only when
// TANDEM_ENABLE_NCCL is on; the counterpart of gloo_broadcast_transport.h
// with the same shape: one NcclBroadcastGroup is one membership epoch
// (tandem.v1.BroadcastGroup with backend "nccl"), rank 0 is the trainer,
// ranks 1..n-1 are rollout workers, and the per-version wire protocol is
// the same (common/weights/broadcast_protocol.h). Daemons create it through
// CreateBroadcastGroup() (broadcast_group.h) for backend "nccl".
//
// Rendezvous: every rank connects as a client to the trainer's c10d
// TCPStore (GlooRendezvousStore) at store_host:store_port; rank 0 publishes
// the ncclUniqueId under "<key_prefix>/nccl_unique_id", the others read it.
//
// Data path: the bytes of a Broadcast() travel host -> pinned host staging
// -> device staging -> ncclBroadcast on the group's own stream -> device ->
// pinned -> host, in pieces of at most `bucket_bytes`, so device and pinned
// memory stay bounded whatever the model size. BroadcastDevice() runs
// ncclBroadcast on the caller's device memory itself, in the same pieces
// (trainer's device payload -> worker's device staging buffer).
//
// Deadlines and abort: the communicator is non-blocking (ncclConfig_t
// blocking = 0). The calling thread polls ncclCommGetAsyncError and the
// stream against the deadline (`timeout` per piece and for the
// rendezvous); on an NCCL error, a passed deadline, or Abort() from another
// thread, it calls ncclCommAbort (which also stops the device kernels
// waiting for a dead peer), marks the group broken and returns. Later calls
// fail fast with FailedPrecondition; the coordinator forms the next epoch.
//
// Without a CUDA device, or without the CUDA runtime and NCCL libraries
// (loaded with dlopen on first use, not linked), Create() returns
// FailedPrecondition; nothing crashes.
//
// Thread-safety: a group is used by one thread at a time (its sender or its
// receiver). Abort() may be called from any thread.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/broadcast_group.h"

namespace tandem::weights {

// The store address, key prefix, rank, world size and timeout (per piece
// of a broadcast here) are BroadcastGroupConfig's; backend and bind_host
// are not read.
struct NcclGroupConfig : BroadcastGroupConfig {
  // CUDA device of this rank; -1 = the calling thread's current device.
  int device = -1;
  // Device and pinned host staging size: broadcasts larger than this go in
  // pieces.
  uint64_t bucket_bytes = uint64_t{64} << 20;
};

// The number of visible CUDA devices, or FailedPrecondition "NCCL weight
// transport: no CUDA device visible (cudaGetDeviceCount: ...)".
absl::StatusOr<int> NcclVisibleDevices();

// Rank 0 that cannot take part in the epoch (no CUDA device, no NCCL)
// stores `reason` under the key where the other ranks wait for its
// ncclUniqueId, so their Create() fails at once with FailedPrecondition
// "... rank 0 cannot run NCCL: <reason>" instead of at the rendezvous
// deadline. Needs neither CUDA nor NCCL; Unavailable if the store cannot
// be reached.
absl::Status NcclRefuseGroup(const NcclGroupConfig& config,
                             absl::string_view reason);

// Checks what a rank > 0 read from the store in place of the
// ncclUniqueId: OK for an id, FailedPrecondition "rank 0 cannot run NCCL:
// <reason>" for NcclRefuseGroup's refusal, DataLoss otherwise. Exposed for
// tests.
absl::Status NcclCheckStoredUniqueId(absl::Span<const uint8_t> stored);

class NcclBroadcastGroup : public BroadcastGroup {
 public:
  // Joins the group; blocks until all world_size ranks have joined or
  // `timeout` passes (Unavailable / DeadlineExceeded then).
  // FailedPrecondition without a CUDA device, InvalidArgument for a bad
  // rank, device or bucket size.
  static absl::StatusOr<std::unique_ptr<NcclBroadcastGroup>> Create(
      const NcclGroupConfig& config);
  ~NcclBroadcastGroup() override;

  int rank() const override;
  int world_size() const override;
  int device() const;
  bool broken() const override;
  // Whether the copies go through pinned host memory (false when it could
  // not be allocated: pageable copies, slower).
  bool pinned() const;

  // Broadcasts `bytes` (host memory) from rank 0 into every rank's `bytes`,
  // in place. Errors mark the group broken: DeadlineExceeded, Unavailable
  // (NCCL or CUDA error), Cancelled (Abort() was called, before or during
  // the call), FailedPrecondition (broken by an earlier failure).
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override;

  // Broadcasts device memory of this rank's device where it lies: no host
  // copy, no staging buffer, the same pieces of at most bucket_bytes and
  // the same deadline per piece, abort and broken semantics as Broadcast().
  // Any size and alignment (NCCL moves bytes). InvalidArgument, with the
  // group left as it was, for a region that is not device memory of this
  // rank's device (cudaPointerGetAttributes, before anything is sent).
  bool broadcasts_device_memory() const override { return true; }
  absl::Status BroadcastDevice(void* device_ptr, uint64_t bytes) override;

  // Marks the group broken and aborts the communicator: a Broadcast() under
  // way in another thread returns Cancelled at its next poll (within
  // milliseconds); later ones fail fast.
  void Abort() override;

 private:
  struct Impl;
  explicit NcclBroadcastGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Rank 0's sender and a worker rank's receiver (broadcast_group.h).
using NcclWeightSender = BroadcastWeightSender;
using NcclWeightReceiver = BroadcastWeightReceiver;

}  // namespace tandem::weights
