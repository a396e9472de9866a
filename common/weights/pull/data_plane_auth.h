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
#include "absl/types/span.h"
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

// The key a process uses now; set when the coordinator hands out an epoch,
// read by every connection. Thread-safe.
class DataPlaneKeyHolder {
 public:
  void Set(const DataPlaneKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<DataPlaneKey> Get() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::optional<DataPlaneKey> key_ ABSL_GUARDED_BY(mu_);
};

// For cluster::MemberSessionOptions::on_data_plane_secret: sets `holder`
// to each secret the coordinator hands out (logged as `component`; a
// secret of the wrong length is logged and ignored).
std::function<void(const tandem::v1::DataPlaneSecret&)> DataPlaneSecretSink(
    std::shared_ptr<DataPlaneKeyHolder> holder, std::string component);

}  // namespace tandem::weights
