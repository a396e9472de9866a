#pragma once

// DataPlaneAuth: the per-epoch secret that authenticates raw weight data
// connections (issue 25 item 3), and the challenge-response that proves it
// without sending it.
//
// The coordinator makes a fresh 32-byte random secret for every
// data-plane epoch and hands it, over the mTLS control plane, only to the
// trainer and rollout workers (DataPlaneKey: epoch + secret). The weight
// server's raw data port then admits only connections that prove they hold
// the current epoch's secret:
//
//   server -> client  challenge: u32 kRawAuthMagic, u64 epoch,
//                     32-byte random nonce                (44 bytes)
//   client -> server  proof:     u32 kRawAuthMagic, u64 epoch,
//                     HMAC-SHA256(secret, kProofContext || epoch || nonce)
//                                                           (44 bytes)
//
// followed by the raw request as before (weight_server.h). The secret
// never crosses the socket; a proof is good for one nonce only (the server
// draws a new one for every connection), so a recorded proof cannot be
// replayed; the comparison is constant-time. A proof for another epoch (a
// stale secret), one that does not start with kRawAuthMagic (a client
// without a secret sends its request's kRawMagic first), or a wrong MAC
// (garbage) is refused at once with UNAUTHENTICATED. All integers are
// little-endian.
//
// The proof gives no confidentiality by itself: what the server sends
// after it is sealed with a key derived from the same secret and the
// challenge's nonce (data_plane_seal.h; weight_server.h, "Raw data path
// confidentiality").

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/clock.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::weights {

inline constexpr size_t kDataPlaneSecretBytes = 32;
inline constexpr size_t kDataPlaneNonceBytes = 32;
inline constexpr uint32_t kRawAuthMagic = 0x31415754;  // "TWA1"
inline constexpr size_t kRawChallengeBytes = 4 + 8 + kDataPlaneNonceBytes;
inline constexpr size_t kRawProofBytes = 4 + 8 + 32;
// Domain separation: an HMAC made for this purpose is never valid for
// another use of the same secret.
inline constexpr char kProofContext[] = "tandem weight data v1";

struct DataPlaneKey {
  uint64_t epoch = 0;
  std::array<uint8_t, kDataPlaneSecretBytes> secret{};
};

// A fresh key for `epoch` from OpenSSL's CSPRNG.
absl::StatusOr<DataPlaneKey> NewDataPlaneKey(uint64_t epoch);
// A key from the bytes the coordinator sent; InvalidArgument naming the
// length when it is not kDataPlaneSecretBytes.
absl::StatusOr<DataPlaneKey> DataPlaneKeyFromBytes(uint64_t epoch,
                                                   absl::Span<const uint8_t>
                                                       secret);

using RawChallenge = std::array<uint8_t, kRawChallengeBytes>;
using RawProof = std::array<uint8_t, kRawProofBytes>;

// Server: a challenge for `epoch` with a fresh random nonce.
absl::StatusOr<RawChallenge> NewRawChallenge(uint64_t epoch);

// Client: the proof for a challenge the server sent. InvalidArgument when
// the bytes are not a challenge (another server, or one without
// authentication answering the request), FailedPrecondition when it names
// an epoch other than `key`'s (the client's secret is stale or newer:
// re-sync with the coordinator).
absl::StatusOr<RawProof> ProveRawChallenge(
    absl::Span<const uint8_t> challenge, const DataPlaneKey& key);

// Server: OK when `proof` answers `challenge` (which it sent) with
// `key`'s secret; Unauthenticated naming what is wrong otherwise:
// truncated, no proof (the client sent something else first), a stale
// epoch, or a wrong MAC.
// `stale`, when set, is told whether the refusal is for a proof of another
// epoch (a well-formed proof with a stale secret) rather than a missing,
// truncated or wrong one.
absl::Status VerifyRawProof(absl::Span<const uint8_t> proof,
                            const RawChallenge& challenge,
                            const DataPlaneKey& key, bool* stale = nullptr);

// The data-plane keys a process holds: the current epoch's, and for a
// bounded grace after a rotation the previous epoch's. Set when the
// coordinator hands out an epoch, read by every connection and broadcast.
//
// Why a grace: members learn a rotation at their next heartbeat, each on
// its own, so for a while after this process took epoch N+1 its peer may
// still seal (the trainer's broadcast) or challenge (the trainer's raw
// port) under epoch N. Without the previous key such a version was refused
// and pulled again over gRPC. With it, data sealed under N still opens, and
// a challenge for N is still answered, until `grace` has passed since the
// rotation (DataPlaneSecretSink: twice the coordinator's heartbeat
// interval). One previous epoch only: an older or unknown epoch is refused,
// and the previous secret is wiped once its grace is over or the next
// rotation replaces it.
//
// The previous key only *opens*: what this process seals, and whom its
// raw port admits, use the current key alone (Get()). A member removed by
// the rotation holds the previous secret, and the grace gives it nothing:
// once the trainer has taken the new epoch, it neither seals under the
// previous one nor admits its proofs. (Until the trainer's own next
// heartbeat the previous epoch is still its current one, as it was before
// there was a grace.)
//
// Thread-safe. `clock` times the grace and outlives the holder.
class DataPlaneKeyHolder {
 public:
  explicit DataPlaneKeyHolder(Clock* clock = RealClock()) : clock_(clock) {}
  ~DataPlaneKeyHolder();
  DataPlaneKeyHolder(const DataPlaneKeyHolder&) = delete;
  DataPlaneKeyHolder& operator=(const DataPlaneKeyHolder&) = delete;

  // Makes `key` the current key. The key it replaces (if any, and unless
  // it is the same epoch and secret, which changes nothing) becomes the
  // previous key, which still opens data for `grace` from now on the
  // clock; zero keeps none. A previous key before it is wiped.
  void Set(const DataPlaneKey& key,
           absl::Duration grace = absl::ZeroDuration())
      ABSL_LOCKS_EXCLUDED(mu_);
  // The current key: the one to seal under, challenge with and admit.
  std::optional<DataPlaneKey> Get() const ABSL_LOCKS_EXCLUDED(mu_);
  // The key that opens data sealed under `epoch`, or answers a challenge
  // for it: the current key, or the previous one while its grace lasts.
  // nullopt for any other epoch (older, unknown, or past its grace).
  std::optional<DataPlaneKey> ForEpoch(uint64_t epoch) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The previous epoch while its grace lasts (for refusal messages).
  std::optional<uint64_t> grace_epoch() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Wipes the previous key once its grace is over.
  void ExpireLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::optional<DataPlaneKey> key_ ABSL_GUARDED_BY(mu_);
  // The previous epoch's key and when its grace ends (on clock_); mutable
  // so that a read past the grace wipes it.
  mutable std::optional<DataPlaneKey> previous_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time previous_until_ ABSL_GUARDED_BY(mu_) =
      absl::InfinitePast();
};

// The previous epoch's grace for a coordinator that heartbeats members
// every `heartbeat_interval`: twice the interval. A peer learns a rotation
// at its next heartbeat, at most one interval after this process did when
// both heartbeat on time; the second interval covers one heartbeat of
// the peer's that is late or lost. A peer silent for longer is about to be
// declared dead (the coordinator's heartbeat_timeout_ms is at least twice
// the interval), which rotates the secret again.
absl::Duration DataPlaneKeyGrace(absl::Duration heartbeat_interval);

// For cluster::MemberSessionOptions::on_data_plane_secret: sets `holder`
// to each secret the coordinator hands out, keeping the one it replaces
// for DataPlaneKeyGrace(heartbeat interval) (logged as `component`; a
// secret of the wrong length is logged and ignored).
std::function<void(const tandem::v1::DataPlaneSecret&,
                   absl::Duration heartbeat_interval)>
DataPlaneSecretSink(std::shared_ptr<DataPlaneKeyHolder> holder,
                    std::string component);

}  // namespace tandem::weights
