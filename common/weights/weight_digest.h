#pragma once

// WeightSha256: the cryptographic digest of a whole weight version. The
// trainer puts the SHA-256 of each version's full flat buffer into its
// manifest (WeightManifest.sha256), which reaches workers over the
// authenticated gRPC plane; a worker checks it on the staged bytes before
// the version can go live, whatever path the bytes took. The per-bucket
// CRC-32C only catches accidents: it is linear, so whoever can write into
// an unauthenticated stream (a Gloo pair socket) can make altered bytes
// match it. The digest gives integrity, not confidentiality.
//
// Thread-safe (no shared state).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::weights {

inline constexpr size_t kWeightSha256Bytes = 32;

// SHA-256 of `bytes` (32 raw bytes), through OpenSSL's EVP interface
// (SHA-NI where the CPU has it). Internal when OpenSSL fails.
absl::StatusOr<std::string> WeightSha256(absl::Span<const uint8_t> bytes);

// SHA-256 over bytes given piece by piece (e.g. a device buffer copied to
// the host in pieces, common/weights/device_digest.h): Update() with each
// piece in order, then Finish() once; the digest equals WeightSha256 of
// the concatenation. Thread-compatible.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(absl::Span<const uint8_t> piece);
  // The 32-byte digest; Internal when OpenSSL failed at any step.
  // REQUIRES: called once.
  absl::StatusOr<std::string> Finish();

 private:
  struct Context;
  Context* context_;
  uint64_t bytes_ = 0;
  bool failed_ = false;
};

// The first `n` bytes of `digest` as lower-case hex, for logs.
std::string DigestPrefixHex(const std::string& digest, size_t n = 8);

// OK when `expected` is the SHA-256 of `flat`. DataLoss naming the version
// and both digests' prefixes otherwise;
// InvalidArgument when `expected` is not 32 bytes. REQUIRES: expected is
// not empty (an empty digest means "none", the caller decides).
absl::Status VerifyWeightSha256(uint64_t version, const std::string& expected,
                                absl::Span<const uint8_t> flat);

// VerifyWeightSha256 with the digest of the `size` staged bytes already
// computed (`actual`, e.g. by Sha256Hasher).
absl::Status CheckWeightSha256(uint64_t version, const std::string& expected,
                               const std::string& actual, uint64_t size);

// True when `status` is VerifyWeightSha256's digest mismatch.
bool IsDigestMismatch(const absl::Status& status);

}  // namespace tandem::weights
