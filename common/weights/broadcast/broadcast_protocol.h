#pragma once

// The per-version wire protocol shared by the collective broadcast
// transports (Gloo, NCCL): each transport supplies "broadcast these bytes
// from rank 0 into every rank's buffer, in place", this file sends and
// receives a version over it.
//
// Per version, all broadcasts from rank 0:
//   1. a 72-byte header: u64 manifest size, u64 payload size, u64 piece
//      size (0: whole buckets), u64 sealing (kBroadcastPlain,
//      kBroadcastSealed, kBroadcastWithheld), u64 data-plane epoch of the
//      seal, 32-byte salt;
//   2. the serialized WeightManifest, zero-padded to a multiple of 4;
//   3. FULL: every bucket in pieces of at most the piece size, broadcast
//      straight into the receiver's staging bucket (no extra copy). A
//      receiver checksums each piece while it is still in cache, and while
//      the next one arrives when the transport can overlap them; DELTA: the encoded delta in pieces of at most
//      bucket_bytes, padded to a multiple of 4.
// Sealed (tls.mode mtls: a data-plane key exists; docs/operations.md,
// "Sealed weight data"): every non-empty piece of 3. crosses the wire as
// AES-256-GCM ciphertext under HKDF(epoch secret, the header's salt,
// "broadcast") (data_plane_seal.h) and is followed by a broadcast of its
// 16-byte tag; the k-th non-empty piece of the version is sealed with index
// k and associated data u64 version, u64 bucket (DELTA: 0), u64 offset. The
// salt is drawn for every version sent, so a version sent twice (a re-send,
// or a version number reused after a restart from a checkpoint) is sealed
// under another key. The sender seals each version once; every receiver
// gets the same ciphertext. A receiver opens each piece in place, after it
// arrived and before it is checksummed; a receiver without the header's
// epoch's secret, or whose piece fails its tag, takes part in the rest of
// the version's broadcasts and refuses it (it is then pulled over gRPC).
// The manifest (names, shapes, CRC-32C and SHA-256 of the buffer, no
// weight values) is not sealed: every member needs it to follow the
// collectives, including one that cannot open the pieces. Withheld (a
// sender under mtls that holds no key yet): 1. and 2. only, no payload;
// receivers refuse the version and pull it. A receiver with a key holder
// refuses a plain version (someone on the wire may have rewritten the
// header), and one without refuses a sealed one.
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
#include "common/weights/data_plane_seal.h"
#include "common/weights/pull/data_plane_auth.h"
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
// `keys` (tls.mode mtls): seal with its current key, or withhold the
// payload while it has none; null: plaintext. `start`, when set, starts a
// piece's broadcast without waiting for it (BroadcastGroup::StartBroadcast):
// the next sealed piece is sealed while the previous one is on the wire.
absl::Status PublishOverBroadcast(
    BroadcastBytesFn broadcast, const v1::WeightManifest& manifest,
    absl::Span<const uint8_t> payload, uint64_t piece_bytes = 0,
    const DataPlaneKeyHolder* keys = nullptr,
    const std::function<std::function<absl::Status()>(absl::Span<uint8_t>)>&
        start = nullptr);

inline constexpr uint64_t kBroadcastPlain = 0;
inline constexpr uint64_t kBroadcastSealed = 1;
inline constexpr uint64_t kBroadcastWithheld = 2;

// What a receiving rank saw of the sealing of its last round.
struct BroadcastSealOutcome {
  bool sealed = false;          // the version came sealed
  bool decrypt_failed = false;  // a piece failed its tag, or no key for it
};

// The first two broadcasts of a version (1. and 2. above), unsealed, for a
// sender that moves the payload itself (broadcast/device_broadcast.h):
// `payload_bytes` and `piece_bytes` go into the header as they are.
absl::Status BroadcastPlainPreamble(BroadcastBytesFn broadcast,
                                    const v1::WeightManifest& manifest,
                                    uint64_t payload_bytes,
                                    uint64_t piece_bytes);

// What a receiving rank learnt from a version's first two broadcasts.
struct BroadcastPreamble {
  v1::WeightManifest manifest;
  uint64_t payload_bytes = 0;
  uint64_t piece_bytes = 0;  // FULL pieces; 0: whole buckets
  uint64_t sealing = kBroadcastPlain;
  uint64_t epoch = 0;  // data-plane epoch of the seal
  SealSalt salt{};
};

// Joins the first two broadcasts of the next version. DataLoss, after
// `abort_group()` (the rest of the stream cannot be followed), for a bad
// header or an unparsable manifest; the broadcast's own errors as they are.
absl::StatusOr<BroadcastPreamble> ReceiveBroadcastPreamble(
    BroadcastBytesFn broadcast, absl::FunctionRef<void()> abort_group);

// A receiving rank: joins every broadcast of the next version and stages it
// into `staging`. `abort_group` is called when the stream cannot be
// followed any more (unparsable manifest or header). `*round_version` is set to the
// version of the round as soon as its manifest arrived. The in-band
// manifest travelled over the unauthenticated pair sockets: `trusted`, when
// not null, supplies the SHA-256 the staged bytes are checked against
// (StagingWeights, "Digest check").
// `keys` (tls.mode mtls): the keys sealed versions are opened with (the
// current epoch's, or the previous epoch's in its grace:
// DataPlaneKeyHolder::ForEpoch); only sealed versions are accepted. Null:
// only plain ones. `seal`, when not null, is told how the round was sealed
// and whether it failed to open.
absl::StatusOr<uint64_t> ReceiveOverBroadcast(
    StartBroadcastFn start, absl::FunctionRef<void()> abort_group,
    StagingWeights* staging, uint64_t* round_version,
    TrustedDigestSource* trusted = nullptr,
    const DataPlaneKeyHolder* keys = nullptr,
    BroadcastSealOutcome* seal = nullptr);

}  // namespace tandem::weights
