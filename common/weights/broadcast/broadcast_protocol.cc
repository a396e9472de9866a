#include "common/weights/broadcast/broadcast_protocol.h"

#include <algorithm>
#include <array>
#include <optional>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/data_plane_seal.h"

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

// The header (broadcast_protocol.h, 1.): 9 u64 words.
struct Header {
  uint64_t manifest_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t piece_bytes = 0;
  uint64_t sealing = kBroadcastPlain;
  uint64_t epoch = 0;
  SealSalt salt{};
};
static_assert(sizeof(Header) == 72);

// A piece's associated data: where it belongs in the version.
std::array<uint8_t, 24> PieceAad(uint64_t version, uint64_t bucket,
                                 uint64_t offset) {
  std::array<uint8_t, 24> aad{};
  const uint64_t words[3] = {version, bucket, offset};
  for (int w = 0; w < 3; ++w) {
    for (int i = 0; i < 8; ++i) {
      aad[8 * w + i] = static_cast<uint8_t>(words[w] >> (8 * i));
    }
  }
  return aad;
}

// The first two broadcasts of a version (broadcast_protocol.h, 1. and
// 2.): `header`, then `serialized` (the manifest, header.manifest_bytes
// long) from a 4-byte aligned buffer.
absl::Status BroadcastHeaderAndManifest(BroadcastBytesFn broadcast,
                                        Header header,
                                        const std::string& serialized) {
  if (absl::Status s =
          broadcast({reinterpret_cast<uint8_t*>(&header), sizeof(header)});
      !s.ok()) {
    return s;
  }
  std::vector<float> scratch = Scratch(serialized.size());
  std::memcpy(scratch.data(), serialized.data(), serialized.size());
  return broadcast(AsBytes(scratch));
}

}  // namespace

absl::Status PublishOverBroadcast(
    BroadcastBytesFn broadcast, const v1::WeightManifest& manifest,
    absl::Span<const uint8_t> payload, uint64_t piece_bytes,
    const DataPlaneKeyHolder* keys,
    const std::function<std::function<absl::Status()>(absl::Span<uint8_t>)>&
        start) {
  const std::string serialized = manifest.SerializeAsString();
  piece_bytes &= ~uint64_t{3};
  Header header{serialized.size(), payload.size(), piece_bytes};
  std::optional<WeightSeal> seal;
  if (keys != nullptr) {
    const std::optional<DataPlaneKey> key = keys->Get();
    header.sealing = key.has_value() ? kBroadcastSealed : kBroadcastWithheld;
    if (key.has_value()) {
      absl::StatusOr<SealSalt> salt = NewSealSalt();
      if (!salt.ok()) return salt.status();
      header.epoch = key->epoch;
      header.salt = *salt;
      absl::StatusOr<WeightSeal> derived =
          WeightSeal::Derive(*key, header.salt, kSealPurposeBroadcast);
      if (!derived.ok()) return derived.status();
      seal = *std::move(derived);
    }
  }
  if (absl::Status s = BroadcastHeaderAndManifest(broadcast, header, serialized);
      !s.ok()) {
    return s;
  }
  if (header.sealing == kBroadcastWithheld) return absl::OkStatus();
  // Root buffers are only read by the broadcast; the const_cast never
  // writes.
  auto* data = const_cast<uint8_t*>(payload.data());
  // Sealed: each piece is sealed into one of two buffers and broadcast
  // from there, then its tag. With `start` the piece after it is sealed
  // into the other buffer while it is on the wire.
  std::vector<float> sealed[2];
  int next_buffer = 0;
  std::function<absl::Status()> in_flight;  // the piece on the wire
  SealTag in_flight_tag{};
  uint64_t index = 0;
  // Waits for the piece on the wire, then broadcasts its tag.
  auto finish = [&]() -> absl::Status {
    if (!in_flight) return absl::OkStatus();
    const absl::Status s = in_flight();
    in_flight = nullptr;
    if (!s.ok()) return s;
    return broadcast({in_flight_tag.data(), in_flight_tag.size()});
  };
  auto send_piece = [&](uint8_t* bytes, uint64_t n, uint64_t bucket,
                        uint64_t offset) -> absl::Status {
    if (!seal.has_value()) return broadcast({bytes, n});
    std::vector<float>& buffer = sealed[next_buffer];
    next_buffer ^= 1;
    if (buffer.size() * 4 < RoundUp4(n)) buffer = Scratch(n);
    absl::Span<uint8_t> out = AsBytes(buffer).subspan(0, n);
    const std::array<uint8_t, 24> aad =
        PieceAad(manifest.policy_version(), bucket, offset);
    SealTag tag{};
    const absl::Status sealed_ok =
        seal->Seal(index++, aad, {bytes, n}, out.data(), &tag);
    if (absl::Status s = finish(); !s.ok() || !sealed_ok.ok()) {
      return s.ok() ? sealed_ok : s;
    }
    in_flight_tag = tag;
    if (start) {
      in_flight = start(out);
      return absl::OkStatus();
    }
    if (absl::Status s = broadcast(out); !s.ok()) return s;
    return broadcast({tag.data(), tag.size()});
  };
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    for (int i = 0; i < manifest.buckets_size(); ++i) {
      const v1::BucketSpec& b = manifest.buckets(i);
      const uint64_t piece = piece_bytes == 0 ? b.byte_size() : piece_bytes;
      for (uint64_t off = 0; off < b.byte_size(); off += piece) {
        const uint64_t n = std::min(piece, b.byte_size() - off);
        if (absl::Status s =
                send_piece(data + b.byte_offset() + off, n,
                           static_cast<uint64_t>(i), off);
            !s.ok()) {
          return s;
        }
      }
    }
    return finish();
  }
  const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
  for (uint64_t off = 0; off < payload.size(); off += piece) {
    const uint64_t n = std::min(piece, payload.size() - off);
    std::vector<float> buf = Scratch(n);
    std::memcpy(buf.data(), data + off, n);
    if (absl::Status s =
            send_piece(reinterpret_cast<uint8_t*>(buf.data()), RoundUp4(n), 0,
                       off);
        !s.ok()) {
      return s;
    }
  }
  return finish();
}

absl::Status BroadcastPlainPreamble(BroadcastBytesFn broadcast,
                                    const v1::WeightManifest& manifest,
                                    uint64_t payload_bytes,
                                    uint64_t piece_bytes) {
  const std::string serialized = manifest.SerializeAsString();
  return BroadcastHeaderAndManifest(
      broadcast, Header{serialized.size(), payload_bytes, piece_bytes},
      serialized);
}

absl::StatusOr<BroadcastPreamble> ReceiveBroadcastPreamble(
    BroadcastBytesFn broadcast, absl::FunctionRef<void()> abort_group) {
  Header header;
  if (absl::Status s =
          broadcast({reinterpret_cast<uint8_t*>(&header), sizeof(header)});
      !s.ok()) {
    return s;
  }
  if (header.piece_bytes % 4 != 0 ||
      header.manifest_bytes > (uint64_t{1} << 30) ||
      header.sealing > kBroadcastWithheld) {
    abort_group();  // cannot know how the rest is cut
    return absl::DataLossError(absl::StrCat(
        "broadcast: bad header (manifest ", header.manifest_bytes,
        " bytes, piece ", header.piece_bytes, " bytes, sealing ",
        header.sealing, ")"));
  }
  std::vector<float> manifest_bytes = Scratch(header.manifest_bytes);
  if (absl::Status s = broadcast(AsBytes(manifest_bytes)); !s.ok()) {
    return s;
  }
  BroadcastPreamble out;
  if (!out.manifest.ParseFromArray(manifest_bytes.data(),
                                   static_cast<int>(header.manifest_bytes))) {
    abort_group();  // cannot know how many broadcasts follow
    return absl::DataLossError("broadcast: received an unparsable manifest");
  }
  // A delta is only sent when smaller than the full copy (DeltaPublisher):
  // a larger size cannot be what the sender meant.
  if (out.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA &&
      header.payload_bytes > out.manifest.total_bytes()) {
    abort_group();  // cannot know how many broadcasts follow
    return absl::DataLossError(absl::StrCat(
        "broadcast: bad header: a ", header.payload_bytes,
        "-byte delta for weights v", out.manifest.policy_version(), " of ",
        out.manifest.total_bytes(), " bytes"));
  }
  out.payload_bytes = header.payload_bytes;
  out.piece_bytes = header.piece_bytes;
  out.sealing = header.sealing;
  out.epoch = header.epoch;
  out.salt = header.salt;
  return out;
}

absl::StatusOr<uint64_t> ReceiveOverBroadcast(
    StartBroadcastFn start, absl::FunctionRef<void()> abort_group,
    StagingWeights* staging, uint64_t* round_version,
    TrustedDigestSource* trusted, const DataPlaneKeyHolder* keys,
    BroadcastSealOutcome* seal_outcome) {
  BroadcastSealOutcome ignored;
  if (seal_outcome == nullptr) seal_outcome = &ignored;
  *seal_outcome = {};
  auto broadcast = [&](absl::Span<uint8_t> bytes) { return start(bytes)(); };
  absl::StatusOr<BroadcastPreamble> preamble =
      ReceiveBroadcastPreamble(broadcast, abort_group);
  if (!preamble.ok()) return preamble.status();
  const BroadcastPreamble& header = *preamble;
  const v1::WeightManifest& manifest = preamble->manifest;
  const uint64_t piece_bytes = header.piece_bytes;
  *round_version = manifest.policy_version();
  if (header.sealing == kBroadcastWithheld) {
    // Nothing else of this version crosses the wire.
    return absl::UnavailableError(absl::StrCat(
        "broadcast: weights v", manifest.policy_version(),
        " withheld: the trainer holds no data-plane secret yet"));
  }
  const bool sealed = header.sealing == kBroadcastSealed;
  seal_outcome->sealed = sealed;
  // From here on every broadcast of the version is joined, whatever
  // happens locally; `local` records the first local failure.
  absl::Status local;
  std::optional<WeightSeal> seal;
  if (sealed && keys == nullptr) {
    local = absl::FailedPreconditionError(absl::StrCat(
        "broadcast: weights v", manifest.policy_version(),
        " came sealed, and this worker holds no data-plane secret "
        "(tls.mode off)"));
  } else if (!sealed && keys != nullptr) {
    seal_outcome->decrypt_failed = true;
    local = absl::DataLossError(absl::StrCat(
        "broadcast: weights v", manifest.policy_version(),
        " came unsealed under tls.mode mtls (refused: its header may have "
        "been rewritten on the way)"));
  } else if (sealed) {
    // The current epoch's key, or the previous one in its grace (a trainer
    // that has not heard of the rotation yet; data_plane_auth.h).
    const std::optional<DataPlaneKey> key = keys->ForEpoch(header.epoch);
    if (!key.has_value()) {
      seal_outcome->decrypt_failed = true;
      const std::optional<DataPlaneKey> current = keys->Get();
      const std::optional<uint64_t> grace = keys->grace_epoch();
      local = absl::UnauthenticatedError(absl::StrCat(
          "broadcast: weights v", manifest.policy_version(),
          " is sealed under data-plane epoch ", header.epoch,
          ", this worker holds ",
          current.has_value() ? absl::StrCat("epoch ", current->epoch)
                              : std::string("no secret yet"),
          grace.has_value()
              ? absl::StrCat(" (and epoch ", *grace, " in its grace)")
              : std::string()));
    } else {
      absl::StatusOr<WeightSeal> derived =
          WeightSeal::Derive(*key, header.salt, kSealPurposeBroadcast);
      if (derived.ok()) {
        seal = *std::move(derived);
      } else {
        local = derived.status();
      }
    }
  }
  // A sealed piece's tag follows it.
  uint64_t index = 0;
  auto receive_tag = [&](SealTag* tag) {
    return broadcast({tag->data(), tag->size()});
  };
  // Opens a piece in place (when it can still be used); a failure is
  // the version's local failure.
  auto open_piece = [&](absl::Span<uint8_t> bytes, const SealTag& tag,
                        uint64_t bucket, uint64_t offset) {
    const uint64_t k = index++;
    if (!seal.has_value() || !local.ok()) return;
    local = seal->Open(k, PieceAad(manifest.policy_version(), bucket, offset),
                       bytes, tag, bytes.data(),
                       absl::StrCat("broadcast: weights v",
                                    manifest.policy_version(), " bucket ",
                                    bucket, " offset ", offset));
    if (!local.ok()) seal_outcome->decrypt_failed = true;
  };
  if (local.ok()) local = staging->Begin(manifest, trusted);
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
    absl::Span<uint8_t> landed;  // where the current piece arrives
    if (!pieces.empty()) arrived = start(landed = target(pieces[0]));
    for (size_t j = 0; j < pieces.size(); ++j) {
      if (absl::Status s = arrived(); !s.ok()) {
        staging->Abort();
        return s;
      }
      const Piece& p = pieces[j];
      const absl::Span<uint8_t> here = landed;
      SealTag tag{};
      if (sealed && p.size > 0) {
        if (absl::Status s = receive_tag(&tag); !s.ok()) {
          staging->Abort();
          return s;
        }
      }
      // The next piece arrives while this one is opened and checksummed.
      if (j + 1 < pieces.size()) {
        arrived = start(landed = target(pieces[j + 1]));
      }
      if (sealed && p.size > 0) open_piece(here, tag, p.bucket, p.offset);
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
    std::vector<uint8_t> delta(header.payload_bytes);
    const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
    for (uint64_t off = 0; off < delta.size(); off += piece) {
      const uint64_t n = std::min(piece, delta.size() - off);
      std::vector<float> buf = Scratch(n);
      if (absl::Status s = broadcast(AsBytes(buf)); !s.ok()) {
        staging->Abort();
        return s;
      }
      if (sealed) {
        SealTag tag{};
        if (absl::Status s = receive_tag(&tag); !s.ok()) {
          staging->Abort();
          return s;
        }
        open_piece(AsBytes(buf), tag, 0, off);
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
