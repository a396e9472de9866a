#include "common/weights/broadcast/broadcast_protocol.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

uint64_t RoundUp4(uint64_t n) { return (n + 3) & ~uint64_t{3}; }

// A 4-byte aligned scratch buffer whose size is a multiple of 4.
std::vector<float> Scratch(uint64_t bytes) {
  return std::vector<float>(RoundUp4(bytes) / 4);
}

absl::Span<uint8_t> AsBytes(std::vector<float>& v) {
  return {reinterpret_cast<uint8_t*>(v.data()), v.size() * 4};
}

// Threads for the checksum of a version's last piece: the cores there are,
// up to 4 (about what memory bandwidth rewards).
int FinalChecksumThreads() {
  static const int threads =
      static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  return threads;
}

}  // namespace

absl::Status PublishOverBroadcast(BroadcastBytesFn broadcast,
                                  const v1::WeightManifest& manifest,
                                  absl::Span<const uint8_t> payload,
                                  uint64_t piece_bytes) {
  const std::string serialized = manifest.SerializeAsString();
  piece_bytes &= ~uint64_t{3};
  uint64_t header[3] = {serialized.size(), payload.size(), piece_bytes};
  if (absl::Status s =
          broadcast({reinterpret_cast<uint8_t*>(header), sizeof(header)});
      !s.ok()) {
    return s;
  }
  std::vector<float> scratch = Scratch(serialized.size());
  std::memcpy(scratch.data(), serialized.data(), serialized.size());
  if (absl::Status s = broadcast(AsBytes(scratch)); !s.ok()) return s;
  // Root buffers are only read by the broadcast; the const_cast never
  // writes.
  auto* data = const_cast<uint8_t*>(payload.data());
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    for (const v1::BucketSpec& b : manifest.buckets()) {
      const uint64_t piece = piece_bytes == 0 ? b.byte_size() : piece_bytes;
      for (uint64_t off = 0; off < b.byte_size(); off += piece) {
        const uint64_t n = std::min(piece, b.byte_size() - off);
        if (absl::Status s = broadcast({data + b.byte_offset() + off, n});
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  }
  const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
  for (uint64_t off = 0; off < payload.size(); off += piece) {
    const uint64_t n = std::min(piece, payload.size() - off);
    std::vector<float> buf = Scratch(n);
    std::memcpy(buf.data(), data + off, n);
    if (absl::Status s = broadcast(AsBytes(buf)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ReceiveOverBroadcast(
    StartBroadcastFn start, absl::FunctionRef<void()> abort_group,
    StagingWeights* staging, uint64_t* round_version,
    TrustedDigestSource* trusted) {
  auto broadcast = [&](absl::Span<uint8_t> bytes) { return start(bytes)(); };
  uint64_t header[3] = {0, 0, 0};
  if (absl::Status s =
          broadcast({reinterpret_cast<uint8_t*>(header), sizeof(header)});
      !s.ok()) {
    return s;
  }
  const uint64_t piece_bytes = header[2];
  if (piece_bytes % 4 != 0 || header[0] > (uint64_t{1} << 30)) {
    abort_group();  // cannot know how the rest is cut
    return absl::DataLossError(
        absl::StrCat("broadcast: bad header (manifest ", header[0],
                     " bytes, piece ", piece_bytes, " bytes)"));
  }
  std::vector<float> manifest_bytes = Scratch(header[0]);
  if (absl::Status s = broadcast(AsBytes(manifest_bytes)); !s.ok()) {
    return s;
  }
  v1::WeightManifest manifest;
  if (!manifest.ParseFromArray(manifest_bytes.data(),
                               static_cast<int>(header[0]))) {
    abort_group();  // cannot know how many broadcasts follow
    return absl::DataLossError("broadcast: received an unparsable manifest");
  }
  *round_version = manifest.policy_version();
  // From here on every broadcast of the version is joined, whatever
  // happens locally; `local` records the first local failure.
  absl::Status local = staging->Begin(manifest, trusted);
  const bool staging_ok = local.ok();
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    // The pieces of every bucket in order: (bucket, offset, size).
    struct Piece {
      uint32_t bucket;
      uint64_t offset, size;
    };
    std::vector<Piece> pieces;
    for (int i = 0; i < manifest.buckets_size(); ++i) {
      const uint64_t size = manifest.buckets(i).byte_size();
      const uint64_t step = piece_bytes == 0 ? size : piece_bytes;
      // An empty bucket is one empty piece: no collective, but sealed.
      uint64_t off = 0;
      do {
        pieces.push_back(
            {static_cast<uint32_t>(i), off, std::min(step, size - off)});
        off += step;
      } while (off < size);
    }
    // Where a piece goes: its place in the staging bucket, or scratch once
    // staging failed (the broadcast is joined all the same). Chosen only
    // after the previous piece arrived, so one scratch buffer serves all.
    std::vector<float> scratch;
    auto target = [&](const Piece& p) {
      absl::Span<uint8_t> dst;
      if (staging_ok && local.ok()) {
        absl::StatusOr<absl::Span<uint8_t>> bucket =
            staging->MutableBucket(p.bucket);
        if (bucket.ok()) {
          dst = bucket->subspan(p.offset, p.size);
        } else {
          local = bucket.status();
        }
      }
      if (dst.empty() && p.size > 0) {
        scratch = Scratch(p.size);
        dst = AsBytes(scratch).subspan(0, p.size);
      }
      return dst;
    };
    std::function<absl::Status()> arrived;
    if (!pieces.empty()) arrived = start(target(pieces[0]));
    for (size_t j = 0; j < pieces.size(); ++j) {
      if (absl::Status s = arrived(); !s.ok()) {
        staging->Abort();
        return s;
      }
      // The next piece arrives while this one is checksummed.
      if (j + 1 < pieces.size()) arrived = start(target(pieces[j + 1]));
      const Piece& p = pieces[j];
      // The version's last piece has nothing left to overlap with: it is
      // checksummed by FinishBucket on every core the checksum may use.
      const bool final_piece = j + 1 == pieces.size();
      if (staging_ok && local.ok() && !final_piece) {
        local = staging->ChecksumBucketPiece(p.bucket, p.offset, p.size);
      }
      const bool last = final_piece || pieces[j + 1].bucket != p.bucket;
      if (last && staging_ok && local.ok()) {
        local = staging->FinishBucket(p.bucket,
                                      final_piece ? FinalChecksumThreads() : 1);
      }
    }
  } else {
    std::vector<uint8_t> delta(header[1]);
    const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
    for (uint64_t off = 0; off < delta.size(); off += piece) {
      const uint64_t n = std::min(piece, delta.size() - off);
      std::vector<float> buf = Scratch(n);
      if (absl::Status s = broadcast(AsBytes(buf)); !s.ok()) {
        staging->Abort();
        return s;
      }
      std::memcpy(delta.data() + off, buf.data(), n);
    }
    if (local.ok()) local = staging->ApplyDelta(delta);
  }
  if (!local.ok()) {
    if (staging_ok) staging->Abort();
    return local;
  }
  return manifest.policy_version();
}

}  // namespace tandem::weights
