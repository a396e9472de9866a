#pragma once

// Shared-memory weight segments: the same-host catch-up path. A weight
// server copies a FULL payload once into a POSIX shared-memory object
// (shm_open, /dev/shm on Linux) and every worker on the host maps it and
// copies the buckets straight into its staging buffer, instead of moving
// every byte through the loopback socket twice (write into the kernel,
// read out of it).
//
// Layout: a kSegmentHeaderBytes header (magic, policy version, payload
// size, a 16-byte random token), then the payload. The server sends the
// segment's name, size and token to the client (FetchWeightsRequest
// .shared_memory, weight_server.h); the client opens the name read-only and
// accepts it only when size, magic, version and token all match, so a
// same-named object of another host or container (a different /dev/shm)
// is never mistaken for it. The payload's buckets are still verified
// against the manifest's CRC-32C by StagingWeights::FinishBucket.
//
// Access: a segment is created mode 0600 (owner read/write only), so only
// processes of the server's user can map the weights; the trainer and the
// workers that share its /dev/shm run as one user. A client opens only an
// object owned by its own effective uid with no group or other bits
// (CheckSegmentOwnerAndMode): anything else (a segment planted by another
// user of the host under an offered name, or one made readable to others)
// is refused with FailedPrecondition naming the path, the mode and the
// owner, and the client streams the payload instead.
//
// Names: /tandem-w-<pid>-<pid namespace inode>-<random>-v<version>. A
// server may remove segments left by a dead process of its own pid
// namespace (a trainer killed with -9): RemoveStaleWeightSegments.
//
// Thread-safety: a SharedWeightSegment and a MappedWeightSegment are
// immutable after creation and safe to share.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::weights {

inline constexpr uint64_t kSegmentHeaderBytes = 4096;
inline constexpr size_t kSegmentTokenBytes = 16;
inline constexpr char kSegmentNamePrefix[] = "/tandem-w-";

// The server's side: owns the object (it does not map it) and unlinks it
// when destroyed (clients that mapped it keep their mapping).
class SharedWeightSegment {
 public:
  // A new process-unique name stem "/tandem-w-<pid>-<pidns>-<random>";
  // segments are named stem + "-v<version>".
  static std::string NewNameStem();

  // Creates `name` (must not exist) and writes the header and `payload`
  // into it (a /dev/shm too small fails with ResourceExhausted).
  static absl::StatusOr<std::unique_ptr<SharedWeightSegment>> Create(
      const std::string& name, uint64_t policy_version,
      absl::Span<const uint8_t> payload);
  ~SharedWeightSegment();
  SharedWeightSegment(const SharedWeightSegment&) = delete;
  SharedWeightSegment& operator=(const SharedWeightSegment&) = delete;

  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }  // header + payload bytes
  const std::string& token() const { return token_; }

 private:
  SharedWeightSegment(std::string name, uint64_t size, std::string token)
      : name_(std::move(name)), size_(size), token_(std::move(token)) {}

  const std::string name_;
  const uint64_t size_;
  const std::string token_;
};

// The client's side: a read-only mapping of a segment a server offered.
class MappedWeightSegment {
 public:
  // Opens and maps `name`. NotFound when there is no such object here (a
  // server on another host or in another IPC namespace), FailedPrecondition
  // when the object is not the one offered (size, magic, version or token
  // differ), Unavailable for other errors.
  static absl::StatusOr<std::unique_ptr<MappedWeightSegment>> Open(
      const std::string& name, uint64_t size, absl::string_view token,
      uint64_t policy_version, uint64_t payload_bytes);
  ~MappedWeightSegment();
  MappedWeightSegment(const MappedWeightSegment&) = delete;
  MappedWeightSegment& operator=(const MappedWeightSegment&) = delete;

  absl::Span<const uint8_t> payload() const { return payload_; }

 private:
  MappedWeightSegment(void* map, uint64_t size)
      : map_(map),
        size_(size),
        payload_(static_cast<const uint8_t*>(map) + kSegmentHeaderBytes,
                 size - kSegmentHeaderBytes) {}

  void* const map_;
  const uint64_t size_;
  const absl::Span<const uint8_t> payload_;
};

// The path of segment `name` in the shm mount, for messages:
// "/dev/shm/tandem-w-...".
std::string SegmentPath(absl::string_view name);

// The check MappedWeightSegment::Open applies to the object it opened:
// owned by `expected_uid` (the caller's effective uid) with permission
// bits exactly 0600. FailedPrecondition otherwise, e.g. "weight segment
// /dev/shm/tandem-w-1-2-ab-v3 has mode 0644 and owner uid 1001; only 0600
// and owner uid 1000 (this process's user) are accepted".
absl::Status CheckSegmentOwnerAndMode(absl::string_view path, uint32_t mode,
                                      uint32_t owner_uid,
                                      uint32_t expected_uid);

// Removes the segments under `dir` (the shm mount, /dev/shm) whose name
// says they were made by a process of this pid namespace that no longer
// runs. Returns how many were removed.
int RemoveStaleWeightSegments(const std::string& dir = "/dev/shm");

}  // namespace tandem::weights
