#pragma once

// Weight broadcast over LibTorch's c10d ProcessGroupGloo (CPU), rendezvous
// through a c10d TCPStore. One GlooBroadcastGroup is one membership epoch
// (tandem.v1.BroadcastGroup): rank 0 is the trainer, which also hosts the
// TCPStore; ranks 1..n-1 are rollout workers. Daemons create it through
// CreateBroadcastGroup() (broadcast_group.h) for backend "gloo".
//
// Wire protocol per version: common/weights/broadcast_protocol.h, as Gloo
// broadcasts from rank 0 of uint8 byte buffers.
//
// Deadlines: every collective, and the rendezvous, carries `timeout`. A
// collective that fails or times out marks the group broken: later calls
// return FailedPrecondition at once, and the coordinator forms the next
// epoch without the dead member (membership changes only between versions).
// Receivers call ReceiveNext() once the coordinator has announced a version;
// waiting longer than `timeout` for a sender breaks the group.
//
// Abort() interrupts: it fails every connection of the group, so a
// collective blocked in it (here, and at the peers through the reset
// sockets) fails at once instead of at its deadline (c10d's
// ProcessGroupNCCL::abort() for Gloo). A rendezvous is ended early through
// BroadcastGroupConfig::cancelled.
//
// Thread-safety: a group is used by one thread at a time (its sender or its
// receiver). Abort() may be called from any thread while the group lives.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/weights/broadcast/broadcast_group.h"

namespace tandem::weights {

// `backend` is not read (this is the Gloo group).
using GlooGroupConfig = BroadcastGroupConfig;

// The TCPStore server the trainer hosts for all epochs (each epoch uses its
// own key prefix). Thread-safe.
class GlooRendezvousStore {
 public:
  // Listens on host:port (port 0 picks a free port).
  static absl::StatusOr<std::unique_ptr<GlooRendezvousStore>> Create(
      const std::string& host, uint16_t port, absl::Duration timeout);
  ~GlooRendezvousStore();
  uint16_t port() const;

 private:
  friend class GlooBroadcastGroup;
  struct Impl;
  explicit GlooRendezvousStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class GlooBroadcastGroup : public BroadcastGroup {
 public:
  // Joins the group; blocks until all world_size ranks have joined or
  // `timeout` passes (Unavailable then). Rank 0 passes the store it hosts
  // (`server`, which must outlive the group); other ranks pass nullptr and
  // connect to store_host:store_port. A rank 0 without a server starts one
  // on store_port.
  static absl::StatusOr<std::unique_ptr<GlooBroadcastGroup>> Create(
      const GlooGroupConfig& config,
      const GlooRendezvousStore* server = nullptr);
  ~GlooBroadcastGroup() override;

  int rank() const override;
  int world_size() const override;
  bool broken() const override;

  // Broadcasts `bytes` from rank 0 into every rank's `bytes`, in place.
  // REQUIRES: size a multiple of 4, data 4-byte aligned. Errors mark the
  // group broken.
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override;
  // Queues the broadcast on the group's worker thread and returns at once.
  std::function<absl::Status()> StartBroadcast(
      absl::Span<uint8_t> bytes) override;

  // Marks the group broken and fails its connections: a collective under
  // way fails now, later ones fail fast. Idempotent.
  void Abort() override;

  uint64_t piece_bytes() const override;

 private:
  struct Impl;
  explicit GlooBroadcastGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Rank 0's sender and a worker rank's receiver (broadcast_group.h).
using GlooWeightSender = BroadcastWeightSender;
using GlooWeightReceiver = BroadcastWeightReceiver;

}  // namespace tandem::weights
