#pragma once

// The raw data path's sending side (weight_server.h, "Raw data path" and
// "Raw data path confidentiality"): whole sends on a blocking socket
// bounded by SO_SNDTIMEO, in the clear or as sealed records. Internal to
// the weight server (raw_data_server.cc).

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/weights/data_plane_seal.h"

namespace tandem::weights::raw_internal {

enum class SendResult { kOk, kClosed, kTimedOut };

// Sends every byte of `iov` (modified) on a blocking socket whose
// SO_SNDTIMEO bounds each wait for the peer to read.
SendResult SendAll(int fd, iovec* iov, int count);

// Sends what a proven connection is answered: in the clear, or with a
// seal as sealed records, each at most kRawSealedRecordBytes of the byte
// stream, numbered from 0 on the connection. Not thread-safe: one per
// connection.
class RawSender {
 public:
  // `sealed`: counts records sealed by the server; the record it numbers
  // `corrupt_at` has a ciphertext byte flipped (CorruptSealedRecordForTest).
  RawSender(int fd, const WeightSeal* seal, std::atomic<uint64_t>* sealed,
            const std::atomic<int64_t>* corrupt_at)
      : fd_(fd), seal_(seal), sealed_(sealed), corrupt_at_(corrupt_at) {}

  // Sends every byte of `iov` (modified).
  SendResult Send(iovec* iov, int count);
  // A status in the raw status format (weight_server.h).
  SendResult SendStatus(const absl::Status& status);

 private:
  const int fd_;
  const WeightSeal* const seal_;
  std::atomic<uint64_t>* const sealed_;
  const std::atomic<int64_t>* const corrupt_at_;
  uint64_t next_record_ = 0;
  std::vector<absl::Span<const uint8_t>> parts_;
  std::vector<uint8_t> cipher_;
};

}  // namespace tandem::weights::raw_internal
