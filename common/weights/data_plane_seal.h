#pragma once

// WeightSeal: confidentiality and integrity of the weight data plane under
// tls.mode mtls (issue 25 item 3; docs/operations.md, "Sealed weight
// data"). The raw data port's stream and the broadcast's pieces are sealed
// with AES-256-GCM (OpenSSL EVP) under a key derived from the data-plane
// epoch secret (data_plane_auth.h):
//
//   key = HKDF-SHA256(ikm  = the epoch's 32-byte secret,
//                     salt = 32 random bytes drawn by the sealing side,
//                     info = kSealContext || purpose || u64 epoch)
//
// The HMAC proof of the raw port uses the secret under another context
// (kProofContext) and never as a cipher key, so neither use can stand in
// for the other. A WeightSeal seals a numbered sequence of pieces; the
// 96-bit GCM nonce is u32 0 || u64 piece index. The salt is fresh for every
// sealed stream (the raw port's per-connection challenge nonce, a
// broadcast version's random salt), so a key is never used for two
// streams and a nonce never repeats under one key as long as no index is
// sealed twice, which each stream's writer guarantees by counting. Nothing
// is derived from a policy version: versions repeat after a trainer
// restarts from a checkpoint.
//
// Open() checks the tag before it writes a byte of plaintext that anyone
// reads: it decrypts into `out` and, on a tag mismatch, zeroes `out` and
// returns DataLoss. A piece sealed under another epoch's secret, another
// salt, another index or other associated data fails its tag.
//
// Thread-safety: a WeightSeal is immutable; Seal and Open may be called
// from several threads at once.

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/weights/pull/data_plane_auth.h"

namespace tandem::weights {

inline constexpr size_t kSealTagBytes = 16;
inline constexpr size_t kSealSaltBytes = 32;
inline constexpr char kSealContext[] = "tandem weight data enc v1";
// Purposes (the HKDF info's second part): one key per use.
inline constexpr char kSealPurposeRaw[] = "raw";
inline constexpr char kSealPurposeBroadcast[] = "broadcast";

using SealTag = std::array<uint8_t, kSealTagBytes>;
using SealSalt = std::array<uint8_t, kSealSaltBytes>;

// `kSealSaltBytes` random bytes from OpenSSL's CSPRNG.
absl::StatusOr<SealSalt> NewSealSalt();

class WeightSeal {
 public:
  // The key for one sealed stream; `salt` must be kSealSaltBytes long
  // (InvalidArgument otherwise).
  static absl::StatusOr<WeightSeal> Derive(const DataPlaneKey& key,
                                           absl::Span<const uint8_t> salt,
                                           absl::string_view purpose);

  uint64_t epoch() const { return epoch_; }

  // Seals the concatenation of `parts` as piece `index` into `out` (as
  // many bytes as the parts hold; may be the parts' own memory when there
  // is one part) and `tag`, binding `aad`. REQUIRES: `index` never sealed
  // before under this WeightSeal.
  absl::Status Seal(uint64_t index, absl::Span<const uint8_t> aad,
                    absl::Span<const absl::Span<const uint8_t>> parts,
                    uint8_t* out, SealTag* tag) const;
  absl::Status Seal(uint64_t index, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> plain, uint8_t* out,
                    SealTag* tag) const {
    const absl::Span<const uint8_t> one[1] = {plain};
    return Seal(index, aad, one, out, tag);
  }

  // Opens piece `index` (`cipher`, `tag`, `aad`) into `out` (cipher.size()
  // bytes; may equal cipher.data()). DataLoss naming `what` and the index
  // when the tag does not match (tampered bytes, another key or epoch,
  // another index); `out` is zeroed then.
  absl::Status Open(uint64_t index, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> cipher, const SealTag& tag,
                    uint8_t* out, absl::string_view what) const;

 private:
  WeightSeal() = default;
  uint64_t epoch_ = 0;
  std::array<uint8_t, 32> key_{};
};

}  // namespace tandem::weights
