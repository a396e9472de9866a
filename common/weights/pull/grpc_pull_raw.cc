#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/logging.h"
#include "common/weights/data_plane_seal.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/grpc_pull_receiver_internal.h"
#include "common/weights/shared_weight_segment.h"
#include "common/weights/pull/weight_server.h"
#include "kernels/crc32c.h"

// GrpcPullReceiver's two data paths that bypass gRPC for the bytes: the raw
// TCP stream from the weight server's data port, and the copy out of a
// shared-memory segment on the same host (grpc_pull_receiver.cc has the
// planning, the long poll and the gRPC stream).

namespace tandem::weights {
namespace {

using pull_internal::CancelledStatus;
using pull_internal::IsFull;
using pull_internal::kRawPieceBytes;
using pull_internal::ResumeRequest;

// Milliseconds to wait in one poll: until `deadline`, at most 200 ms so
// cancellation is noticed.
int PollMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 0, 200));
}

// Connects to host:port before `deadline` (at most 5 s); -1 with errno set
// when it cannot.
int ConnectWithin(const std::string& host, uint16_t port, absl::Time deadline) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      const int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(5));
    const int ms = static_cast<int>(
        std::max<int64_t>(absl::ToInt64Milliseconds(until - absl::Now()), 0));
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (poll(&p, 1, ms) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      close(fd);
      errno = err != 0 ? err : ETIMEDOUT;
      return -1;
    }
  }
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::Status GrpcPullReceiver::RawRead(int fd, void* dst, size_t n,
                                       absl::Time deadline) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    if (cancelled()) return CancelledStatus();
    const int ms = PollMillis(deadline);
    if (ms == 0) {
      return absl::DeadlineExceededError(
          "raw weight stream: deadline passed while reading");
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready = poll(&pfd, 1, ms);
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("raw weight stream: poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      if (cancelled()) return CancelledStatus();
      return absl::UnavailableError(absl::StrCat(
          "raw weight stream: ",
          got == 0 ? "connection closed early" : std::strerror(errno)));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status GrpcPullReceiver::ReadRawStream(
    StagingWeights* staging, const v1::WeightManifest& manifest,
    absl::Time deadline, uint32_t* bucket, uint64_t* offset,
    std::vector<uint8_t>* delta,
    std::optional<v1::SharedWeightSegment>* segment, bool* connected) {
  *connected = false;
  std::string host;
  uint16_t port = 0;
  {
    absl::MutexLock lock(&mu_);
    host = data_host_;
    port = data_port_;
  }
  if (port == 0) return absl::OkStatus();
  std::optional<DataPlaneKey> key;
  if (options_.data_plane_key != nullptr) {
    key = options_.data_plane_key->Get();
    if (!key.has_value()) {
      // No epoch secret yet: FetchWeights (mTLS) carries this stream.
      absl::MutexLock lock(&mu_);
      ++stats_.raw_auth_fallbacks;
      return absl::OkStatus();
    }
  }
  const int fd = ConnectWithin(host, port, deadline);
  if (fd < 0) {
    // Not reachable from here (e.g. bound to the trainer's loopback):
    // FetchWeights carries this and later streams of the version.
    absl::MutexLock lock(&mu_);
    data_port_ = 0;
    return absl::OkStatus();
  }
  *connected = true;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      close(fd);
      return CancelledStatus();
    }
    active_fd_ = fd;
    ++stats_.raw_streams;
  }
  // With a key: the challenge (its nonce salts the stream's seal), the
  // seal, and the record being read (weight_server.h, "Raw data path
  // confidentiality").
  uint8_t challenge[kRawChallengeBytes] = {};
  std::optional<WeightSeal> seal;
  std::vector<uint8_t> record;
  size_t record_at = 0;
  uint64_t record_index = 0;
  bool tag_failed = false;
  // The first record's length, read to tell it from a refusal in the clear.
  std::optional<uint32_t> peeked_length;
  // The rest of a raw status sent in the clear, its magic already read:
  // code and message length into `tail`, the message (at most 64 KiB).
  auto read_clear_status = [&](uint32_t tail[2],
                               std::string* message) -> absl::Status {
    RETURN_IF_ERROR(RawRead(fd, tail, 2 * sizeof(uint32_t), deadline));
    message->assign(std::min<uint32_t>(tail[1], 1u << 16), '\0');
    return RawRead(fd, message->data(), message->size(), deadline);
  };
  // Reads n plaintext bytes of the stream: straight from the socket, or
  // out of opened records, each opened whole before a byte of it is used.
  auto read = [&](void* dst, size_t n) -> absl::Status {
    if (!seal.has_value()) return RawRead(fd, dst, n, deadline);
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (record_at == record.size()) {
        uint32_t length = 0;
        if (peeked_length.has_value()) {
          length = *peeked_length;
          peeked_length.reset();
        } else if (absl::Status s =
                       RawRead(fd, &length, sizeof(length), deadline);
                   !s.ok()) {
          return s;
        }
        if (length == 0 || length > kRawSealedRecordBytes) {
          tag_failed = true;
          return absl::DataLossError(absl::StrCat(
              "raw weight stream from ", host, ":", port, ": weights v",
              manifest.policy_version(), " bucket ", *bucket, " offset ",
              *offset, ": sealed record ", record_index, " of ", length,
              " bytes (at most ", kRawSealedRecordBytes, ")"));
        }
        // A record the caller wants whole is read and opened where it
        // goes (the caller uses none of it unless its tag holds); others
        // through `record`.
        const bool direct = n >= length;
        uint8_t* into = direct ? p : nullptr;
        if (!direct) {
          record.resize(length);
          into = record.data();
        }
        SealTag tag;
        if (absl::Status s = RawRead(fd, into, length, deadline); !s.ok()) {
          return s;
        }
        if (absl::Status s = RawRead(fd, tag.data(), tag.size(), deadline);
            !s.ok()) {
          return s;
        }
        if (absl::Status s = seal->Open(
                record_index,
                {reinterpret_cast<const uint8_t*>(&length), sizeof(length)},
                absl::MakeConstSpan(into, length), tag, into, "raw");
            !s.ok()) {
          tag_failed = true;
          return absl::DataLossError(absl::StrCat(
              "raw weight stream from ", host, ":", port, ": weights v",
              manifest.policy_version(), " bucket ", *bucket, " offset ",
              *offset, ": ", s.message()));
        }
        ++record_index;
        if (direct) {
          record.clear();
          record_at = 0;
          p += length;
          n -= length;
          continue;
        }
        record_at = 0;
      }
      const size_t take = std::min(n, record.size() - record_at);
      std::memcpy(p, record.data() + record_at, take);
      record_at += take;
      p += take;
      n -= take;
    }
    return absl::OkStatus();
  };
  absl::Status result = [&]() -> absl::Status {
    v1::FetchWeightsRequest request =
        ResumeRequest(manifest, *bucket, *offset, options_.raw_chunk_bytes);
    request.set_shared_memory(segment != nullptr);
    const std::string serialized = request.SerializeAsString();
    std::string out;
    if (key.has_value()) {
      // The server speaks first: its challenge, or (no secret there yet)
      // a refusal in the raw status format.
      if (absl::Status s = RawRead(fd, challenge, 4, deadline); !s.ok()) {
        return s;
      }
      uint32_t magic = 0;
      std::memcpy(&magic, challenge, 4);
      if (magic == kRawMagic) {
        uint32_t tail[2] = {0, 0};
        std::string message;
        if (absl::Status s = read_clear_status(tail, &message); !s.ok()) {
          return s;
        }
        return absl::UnauthenticatedError(
            absl::StrCat("raw weight stream from ", host, ":", port,
                         " refused before the handshake: ", message));
      }
      if (magic != kRawAuthMagic) {
        return absl::UnavailableError(
            absl::StrCat("raw weight stream from ", host, ":", port,
                         ": not a weight data server (bad magic)"));
      }
      if (absl::Status s =
              RawRead(fd, challenge + 4, sizeof(challenge) - 4, deadline);
          !s.ok()) {
        return s;
      }
      // A challenge for the previous epoch, in its grace (the server has
      // not heard of the rotation yet), is answered with that epoch's key,
      // which then opens the stream. At any other epoch (this process's
      // secret is stale, or older than the server's), answer for our own
      // epoch anyway: the server then logs and counts a stale secret, not
      // garbage, and refuses it.
      uint64_t challenge_epoch = 0;
      std::memcpy(&challenge_epoch, challenge + 4, sizeof(challenge_epoch));
      if (challenge_epoch != key->epoch) {
        const std::optional<DataPlaneKey> in_grace =
            options_.data_plane_key->ForEpoch(challenge_epoch);
        if (in_grace.has_value()) key = in_grace;
      }
      std::memcpy(challenge + 4, &key->epoch, sizeof(key->epoch));
      absl::StatusOr<RawProof> proof = ProveRawChallenge(challenge, *key);
      if (!proof.ok()) {
        return absl::UnauthenticatedError(proof.status().message());
      }
      out.assign(reinterpret_cast<const char*>(proof->data()), proof->size());
    }
    const size_t head_at = out.size();
    out.resize(head_at + 8);
    const uint32_t head[2] = {kRawMagic,
                              static_cast<uint32_t>(serialized.size())};
    std::memcpy(out.data() + head_at, head, sizeof(head));
    out += serialized;
    if (send(fd, out.data(), out.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(out.size())) {
      return absl::UnavailableError(
          absl::StrCat("raw weight stream: sending the request to ", host, ":",
                       port, " failed: ", std::strerror(errno)));
    }
    if (key.has_value()) {
      // Everything the server sends from here on is sealed under a key of
      // this connection: the challenge's nonce salts it.
      absl::StatusOr<WeightSeal> derived = WeightSeal::Derive(
          *key, absl::MakeConstSpan(challenge).subspan(12, kSealSaltBytes),
          kSealPurposeRaw);
      if (!derived.ok()) return derived.status();
      seal = *std::move(derived);
      // A refused proof is answered in the clear (the server has no seal
      // for this connection then); kRawMagic is far above any record
      // length, so the first word tells the two apart. Only a refusal may
      // come in the clear: a plaintext OK could be anyone's.
      uint32_t word = 0;
      if (absl::Status s = RawRead(fd, &word, sizeof(word), deadline);
          !s.ok()) {
        return s;
      }
      if (word == kRawMagic) {
        uint32_t tail[2] = {0, 0};
        std::string message;
        if (absl::Status s = read_clear_status(tail, &message); !s.ok()) {
          return s;
        }
        if (tail[0] == 0) {
          tag_failed = true;
          return absl::DataLossError(absl::StrCat(
              "raw weight stream from ", host, ":", port, ": weights v",
              manifest.policy_version(),
              ": an unsealed answer to a sealed request"));
        }
        return absl::Status(static_cast<absl::StatusCode>(tail[0]),
                            absl::StrCat("raw weight stream from ", host, ":",
                                         port, " refused: ", message));
      }
      peeked_length = word;
    }
    uint32_t status[3] = {0, 0, 0};
    if (absl::Status s = read(status, sizeof(status)); !s.ok()) {
      return s;
    }
    if (status[0] != kRawMagic || status[2] > (1u << 16)) {
      return absl::UnavailableError(
          absl::StrCat("raw weight stream from ", host, ":", port,
                       ": not a weight data server (bad magic)"));
    }
    if (status[1] != 0) {
      std::string message(status[2], '\0');
      if (absl::Status s =
              read(message.data(), message.size());
          !s.ok()) {
        return s;
      }
      return absl::Status(static_cast<absl::StatusCode>(status[1]),
                          absl::StrCat("FetchWeights (raw): ", message));
    }
    const bool full = IsFull(manifest);
    const uint32_t num_buckets =
        full ? static_cast<uint32_t>(manifest.buckets_size()) : 1;
    absl::Span<uint8_t> dst;  // the current bucket in staging (FULL)
    while (*bucket < num_buckets) {
      RawChunkHeader h{};
      if (absl::Status s = read(&h, sizeof(h)); !s.ok()) {
        return s;
      }
      if (h.flags & kRawEnd) {
        return absl::UnavailableError("raw weight stream ended early");
      }
      if (h.flags & kRawSharedSegment) {
        std::string m(std::min<uint32_t>(h.size, 1u << 16), '\0');
        if (segment == nullptr || h.size != m.size()) {
          return absl::AbortedError(
              absl::StrCat("weights v", manifest.policy_version(),
                           ": unexpected shared-memory segment offer"));
        }
        if (absl::Status s = read(m.data(), m.size());
            !s.ok()) {
          return s;
        }
        v1::SharedWeightSegment offer;
        if (kernels::Crc32c(m.data(), m.size()) != h.crc32c ||
            !offer.ParseFromString(m)) {
          return absl::AbortedError(
              absl::StrCat("weights v", manifest.policy_version(),
                           ": garbled shared-memory segment offer"));
        }
        *segment = std::move(offer);
        return absl::OkStatus();
      }
      const uint64_t bucket_size =
          full ? manifest.buckets(static_cast<int>(*bucket)).byte_size()
               : manifest.total_bytes();
      // An encoded delta is far smaller than the full buffer; the bound
      // only keeps a confused server from making us allocate without limit.
      const uint64_t delta_limit = 2 * manifest.total_bytes() + (1u << 20);
      if (h.bucket != *bucket || h.offset != *offset ||
          (full && h.size > bucket_size - *offset) ||
          (!full && *offset + h.size > delta_limit)) {
        // Aborted (not DataLoss): the stream is retried from the resume
        // point.
        return absl::AbortedError(absl::StrCat(
            "weights v", manifest.policy_version(), ": raw chunk at (bucket ",
            h.bucket, ", offset ", h.offset, ", ", h.size,
            " bytes), expected (", *bucket, ", ", *offset, ")"));
      }
      uint8_t* into = nullptr;
      if (full) {
        if (dst.empty()) {
          absl::StatusOr<absl::Span<uint8_t>> b =
              staging->MutableBucket(*bucket);
          if (!b.ok()) return b.status();
          dst = *b;
        }
        into = dst.data() + *offset;
      } else {
        delta->resize(*offset + h.size);
        into = delta->data() + *offset;
      }
      // A whole bucket is verified once, by FinishBucket below, against
      // the manifest; it is read in pieces, each checksummed while still in
      // cache, so FinishBucket has nothing left to read.
      const bool whole_bucket = full && *offset == 0 && h.size == bucket_size;
      const uint64_t piece = whole_bucket ? kRawPieceBytes : h.size;
      uint64_t k = 0;
      do {
        const uint64_t n = std::min(piece, h.size - k);
        if (absl::Status s = read(into + k, n); !s.ok()) {
          if (!full) delta->resize(*offset);
          return s;
        }
        if (whole_bucket) {
          if (absl::Status s = staging->ChecksumBucketPiece(*bucket, k, n);
              !s.ok()) {
            return s;
          }
        }
        k += n;
      } while (k < h.size);
      if (!whole_bucket && kernels::Crc32c(into, h.size) != h.crc32c) {
        if (!full) delta->resize(*offset);
        absl::MutexLock lock(&mu_);
        ++stats_.chunk_crc_errors;
        return absl::AbortedError(absl::StrCat(
            "weights v", manifest.policy_version(), " bucket ", *bucket,
            " offset ", *offset, ": chunk crc32c mismatch"));
      }
      *offset += h.size;
      {
        absl::MutexLock lock(&mu_);
        stats_.bytes += h.size;
      }
      if (h.flags & kRawBucketComplete) {
        if (full) {
          if (*offset != bucket_size) {
            return absl::AbortedError(absl::StrCat(
                "weights v", manifest.policy_version(), " bucket ", *bucket,
                " complete at ", *offset, " of ", bucket_size, " bytes"));
          }
          // A bad bucket means the server's copy is bad: DataLoss, not
          // retried.
          if (absl::Status s = staging->FinishBucket(*bucket); !s.ok()) {
            return s;
          }
          dst = {};
        }
        ++*bucket;
        *offset = 0;
      }
    }
    return absl::OkStatus();
  }();
  absl::MutexLock lock(&mu_);
  active_fd_ = -1;
  close(fd);
  if (tag_failed && !result.ok()) {
    // Tampered or garbled on the wire: nothing of the failed record was
    // used. FetchWeights (mTLS) carries the rest of the version from the
    // resume point; the next version tries the raw path again.
    ++stats_.raw_decrypt_failures;
    --stats_.raw_streams;
    ComponentLogger("weights")->warn("refused a sealed raw stream: {}; "
                                     "pulling over FetchWeights",
                                     std::string(result.message()));
    *connected = false;
    return absl::OkStatus();
  }
  if (absl::IsUnauthenticated(result)) {
    // No stale or refused secret stops a pull: FetchWeights (mTLS)
    // carries the stream; the next one tries the raw path again with
    // whatever key is current then.
    ++stats_.raw_auth_fallbacks;
    --stats_.raw_streams;
    ComponentLogger("weights")->warn("{}; pulling over FetchWeights",
                                     std::string(result.message()));
    *connected = false;
    return absl::OkStatus();
  }
  return result;
}

absl::Status GrpcPullReceiver::CopySharedSegment(
    StagingWeights* staging, const v1::WeightManifest& manifest,
    const v1::SharedWeightSegment& segment, absl::Time deadline,
    uint32_t* bucket, uint64_t* offset, bool* opened) {
  *opened = false;
  absl::StatusOr<std::unique_ptr<MappedWeightSegment>> mapped =
      MappedWeightSegment::Open(segment.name(), segment.size(), segment.token(),
                                manifest.policy_version(),
                                manifest.total_bytes());
  if (!mapped.ok()) return mapped.status();
  *opened = true;
  const absl::Span<const uint8_t> payload = (*mapped)->payload();
  const auto num_buckets = static_cast<uint32_t>(manifest.buckets_size());
  while (*bucket < num_buckets) {
    if (cancelled()) return CancelledStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          "shared-memory weight copy: deadline passed");
    }
    const v1::BucketSpec& b = manifest.buckets(static_cast<int>(*bucket));
    if (b.byte_offset() + b.byte_size() > payload.size() ||
        *offset > b.byte_size()) {
      return absl::DataLossError(
          absl::StrCat("weights v", manifest.policy_version(), " bucket ",
                       *bucket, " lies outside the shared-memory segment"));
    }
    const absl::Span<const uint8_t> rest =
        payload.subspan(b.byte_offset() + *offset, b.byte_size() - *offset);
    // Copied in pieces, each checksummed while still in cache (as on the
    // raw path), so FinishBucket has nothing left to read; a bucket resumed
    // mid-way is checksummed whole by FinishBucket.
    const bool pieces = *offset == 0;
    for (uint64_t k = 0; k < rest.size();) {
      const uint64_t n = std::min<uint64_t>(kRawPieceBytes, rest.size() - k);
      if (absl::Status s = staging->WriteBucketChunk(*bucket, *offset + k,
                                                     rest.subspan(k, n));
          !s.ok()) {
        return s;
      }
      if (pieces) {
        if (absl::Status s = staging->ChecksumBucketPiece(*bucket, k, n);
            !s.ok()) {
          return s;
        }
      }
      k += n;
    }
    {
      absl::MutexLock lock(&mu_);
      stats_.bytes += rest.size();
      stats_.shm_bytes += rest.size();
    }
    // A bad bucket means the segment (the server's copy) is bad: DataLoss
    // rejects the version, as on the socket paths.
    if (absl::Status s = staging->FinishBucket(*bucket); !s.ok()) return s;
    ++*bucket;
    *offset = 0;
  }
  return absl::OkStatus();
}

}  // namespace tandem::weights
