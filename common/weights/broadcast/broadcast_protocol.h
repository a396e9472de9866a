#pragma once

// The per-version wire protocol shared by the collective broadcast
// transports (Gloo, NCCL): each transport supplies "broadcast these bytes
// from rank 0 into every rank's buffer, in place", this file sends and
// receives a version over it.
//
// Per version, all broadcasts from rank 0:
//   1. a 24-byte header: u64 manifest size, u64 payload size, u64 piece
//      size (0: whole buckets);
//   2. the serialized WeightManifest, zero-padded to a multiple of 4;
//   3. FULL: every bucket in pieces of at most the piece size, broadcast
//      straight into the receiver's staging bucket (no extra copy). A
//      receiver checksums each piece while it is still in cache, and while
//      the next one arrives when the transport can overlap them; DELTA: the encoded delta in pieces of at most
//      bucket_bytes, padded to a multiple of 4.
// Every buffer handed to the broadcast function is 4-byte aligned and a
// multiple of 4 bytes long (bucket sizes of a FlatWeightLayout are).
// Receivers always take part in every broadcast of a version, even after a
// local failure (stale version, bad checksum), so one bad member never
// desynchronises or hangs the others; the failure is reported afterwards.

#include <cstdint>
#include <functional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/weights/staging_weights.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

// Broadcasts `bytes` from rank 0 into every rank's `bytes`, in place.
using BroadcastBytesFn = absl::FunctionRef<absl::Status(absl::Span<uint8_t>)>;
// Starts such a broadcast; the returned completion waits for it and returns
// its status (BroadcastGroup::StartBroadcast).
using StartBroadcastFn = absl::FunctionRef<std::function<absl::Status()>(
    absl::Span<uint8_t>)>;

// Rank 0: sends one version, FULL buckets in pieces of at most
// `piece_bytes` (rounded down to a multiple of 4; 0: whole buckets). The
// payload is only read.
absl::Status PublishOverBroadcast(BroadcastBytesFn broadcast,
                                  const v1::WeightManifest& manifest,
                                  absl::Span<const uint8_t> payload,
                                  uint64_t piece_bytes = 0);

// A receiving rank: joins every broadcast of the next version and stages it
// into `staging`. `abort_group` is called when the stream cannot be
// followed any more (unparsable manifest or header). `*round_version` is set to the
// version of the round as soon as its manifest arrived. The in-band
// manifest travelled over the unauthenticated pair sockets: `trusted`, when
// not null, supplies the SHA-256 the staged bytes are checked against
// (StagingWeights, "Digest check").
absl::StatusOr<uint64_t> ReceiveOverBroadcast(
    StartBroadcastFn start, absl::FunctionRef<void()> abort_group,
    StagingWeights* staging, uint64_t* round_version,
    TrustedDigestSource* trusted = nullptr);

}  // namespace tandem::weights
