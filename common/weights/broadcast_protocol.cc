#include "common/weights/broadcast_protocol.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

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

}  // namespace

absl::Status PublishOverBroadcast(BroadcastBytesFn broadcast,
                                  const v1::WeightManifest& manifest,
                                  absl::Span<const uint8_t> payload) {
  const std::string serialized = manifest.SerializeAsString();
  uint64_t header[2] = {serialized.size(), payload.size()};
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
      if (absl::Status s = broadcast(
              {data + b.byte_offset(), static_cast<size_t>(b.byte_size())});
          !s.ok()) {
        return s;
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
    StagingWeights* staging, uint64_t* round_version) {
  auto broadcast = [&](absl::Span<uint8_t> bytes) { return start(bytes)(); };
  uint64_t header[2] = {0, 0};
  if (absl::Status s =
          broadcast({reinterpret_cast<uint8_t*>(header), sizeof(header)});
      !s.ok()) {
    return s;
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
  absl::Status local = staging->Begin(manifest);
  const bool staging_ok = local.ok();
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    // Where bucket i goes: its staging bucket, or scratch once staging
    // failed (the broadcast is joined all the same). Chosen only after
    // bucket i-1 arrived, so one scratch buffer serves every bucket.
    std::vector<float> scratch;
    auto target = [&](int i) {
      absl::Span<uint8_t> dst;
      if (staging_ok && local.ok()) {
        absl::StatusOr<absl::Span<uint8_t>> bucket =
            staging->MutableBucket(static_cast<uint32_t>(i));
        if (bucket.ok()) {
          dst = *bucket;
        } else {
          local = bucket.status();
        }
      }
      const uint64_t size = manifest.buckets(i).byte_size();
      if (dst.empty() && size > 0) {
        scratch = Scratch(size);
        dst = AsBytes(scratch).subspan(0, size);
      }
      return dst;
    };
    const int n = manifest.buckets_size();
    std::function<absl::Status()> arrived;
    if (n > 0) arrived = start(target(0));
    for (int i = 0; i < n; ++i) {
      if (absl::Status s = arrived(); !s.ok()) {
        staging->Abort();
        return s;
      }
      // Bucket i+1 arrives while bucket i is checksummed.
      if (i + 1 < n) arrived = start(target(i + 1));
      if (staging_ok && local.ok()) {
        local = staging->FinishBucket(static_cast<uint32_t>(i));
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
