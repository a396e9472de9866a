#pragma once

// WeightTreeSha256: a digest of a whole weight version that a GPU computes
// in parallel (issue 22: the plain SHA-256 of weight_digest.h is one
// sequential chain, about 1 s per GiB on the host, the whole critical path
// of a device go-live). The trainer puts it in WeightManifest.tree_sha256
// next to sha256; a receiver whose staged bytes are on a CUDA device checks
// it there (kernels/cuda/sha256_tree_cuda.h), under the same trust as
// sha256 (the manifest that carries it reaches workers over gRPC).
//
// Definition (n = the buffer's length in bytes; every message below is
// hashed with SHA-256 and ENDS with one domain byte):
//   leaves:  the buffer cut into L = 4096-byte leaves, the last shorter;
//            n == 0 gives one empty leaf;
//            leaf = SHA-256(leaf bytes || 0x00)
//   levels:  each level groups up to F = 128 consecutive digests of the
//            level below, the last group shorter;
//            node = SHA-256(child digests in order || 0x01),
//            until one digest remains: the top (a lone leaf is the top);
//   root:    SHA-256(top || u64le(n) || u32le(L) || u32le(F) || 0x02).
// Why so:
// - Domain bytes: a leaf, a node and the root never hash the same bytes
//   (their last bytes differ), so no leaf can pass for a node (the second
//   preimage trick against plain Merkle trees); any two buffers with one
//   root give a SHA-256 collision. The byte is a SUFFIX, not a prefix, so
//   a leaf's bytes start the message and keep their alignment: the device
//   kernel reads them as 16-byte words from global memory (a prefix byte
//   would shift every word of the 4 KiB leaf by one byte).
// - The root binds n, L and F: buffers of different lengths (truncation,
//   a missing last leaf) and a receiver built with other constants cannot
//   agree on a root by accident.
// - L = 4096: 262144 leaves per GiB, enough threads to fill a GPU, and the
//   extra hashing over the plain SHA-256 is one block per 64 (1.6%).
//   F = 128: 4 KiB of child digests per node, the same work per thread as
//   a leaf; 1 GiB is three levels above the leaves.
// L and F are fixed constants, not manifest fields: a manifest cannot
// choose a degenerate tree (L = 1) that makes receivers slow, and a
// change of either changes every root, which the root's binding of both
// makes a refusal rather than a silent acceptance.
//
// Thread-safe (no shared state); TreeSha256Hasher is thread-compatible.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/sha256_core.h"

namespace tandem::weights {

inline constexpr uint64_t kTreeLeafBytes = kernels::sha256::kTreeLeafBytes;
inline constexpr uint64_t kTreeFanout = kernels::sha256::kTreeFanout;
// Threads of WeightTreeSha256 and TreeSha256Hasher by default: a few, so
// that the trainer's publish does not take every core of the host.
inline constexpr int kTreeDigestThreads = 4;

// The tree digest over bytes given piece by piece, like Sha256Hasher:
// Update() with each piece in order, then Finish() once; the root equals
// WeightTreeSha256 of the concatenation. Whole leaves of a piece are hashed
// by up to `threads` threads (each Update joins its threads before it
// returns); memory stays O(F x tree depth) digests plus one partial leaf,
// whatever the size. OpenSSL's SHA-256 per message. Thread-compatible.
class TreeSha256Hasher {
 public:
  explicit TreeSha256Hasher(int threads = kTreeDigestThreads);
  TreeSha256Hasher(const TreeSha256Hasher&) = delete;
  TreeSha256Hasher& operator=(const TreeSha256Hasher&) = delete;

  void Update(absl::Span<const uint8_t> piece);
  // The 32-byte root; Internal when OpenSSL failed at any step.
  // REQUIRES: called once.
  absl::StatusOr<std::string> Finish();

 private:
  // Adds `count` leaf digests (32 bytes each) to level 0, in order.
  void AddLeafDigests(const uint8_t* digests, uint64_t count);
  // Appends `digest` to `level`, hashing a full group into the level above.
  void Push(size_t level, const uint8_t* digest);
  void HashLeaves(const uint8_t* data, uint64_t leaves);

  int threads_;
  uint64_t bytes_ = 0;
  bool failed_ = false;
  std::vector<uint8_t> partial_leaf_;  // < kTreeLeafBytes bytes
  // pending_[k]: the digests of level k not yet grouped (< F of them);
  // grouped_[k]: how many full groups level k has passed up.
  std::vector<std::vector<uint8_t>> pending_;
  std::vector<uint64_t> grouped_;
  std::vector<uint8_t> leaf_digests_;  // scratch of HashLeaves
};

// The tree root (32 raw bytes) of `bytes`. Internal when OpenSSL fails.
absl::StatusOr<std::string> WeightTreeSha256(absl::Span<const uint8_t> bytes,
                                             int threads = kTreeDigestThreads);

// OK when `actual` (the tree root of the `size` staged bytes) is
// `expected`. DataLoss naming the version and both prefixes on a mismatch
// (IsDigestMismatch is true for it); InvalidArgument when `expected` is not
// 32 bytes.
absl::Status CheckWeightTreeSha256(uint64_t version,
                                   const std::string& expected,
                                   const std::string& actual, uint64_t size);

}  // namespace tandem::weights
