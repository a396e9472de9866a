#pragma once

// A client of the trainer's c10d TCPStore (the rendezvous of Gloo and NCCL
// broadcast groups) that never waits past its deadline.
//
// LibTorch 2's TCPStore client pings the server from its constructor and
// reads the answer with no timeout: a store port that accepts connections
// but never answers (a frozen trainer, a port taken by something else) held
// the caller, and the daemon's shutdown, forever. ConnectStoreClient runs
// the constructor on a thread of its own; past `timeout` it shuts down the
// sockets that thread opened to the store's port (sockets that did not
// exist before, by inode, and whose peer has that port), which ends the read with an
// error, and joins the thread. Only LibTorch files include this header.

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::weights {

// Connects to the TCPStore at host:port. Unavailable when it cannot be
// reached, DeadlineExceeded when it does not answer within `timeout`.
absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> ConnectStoreClient(
    const std::string& host, uint16_t port, absl::Duration timeout);

}  // namespace tandem::weights
