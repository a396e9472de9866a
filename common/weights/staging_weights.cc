#include "common/weights/staging_weights.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/weights/finite_weights.h"
#include "common/weights/weight_digest.h"
#include "kernels/crc32c.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"

namespace tandem::weights {

absl::StatusOr<std::unique_ptr<StagingWeights>> StagingWeights::Create(
    FlatWeightLayout layout, StagingMode mode) {
  return std::unique_ptr<StagingWeights>(
      new StagingWeights(std::move(layout), mode));
}

StagingWeights::StagingWeights(FlatWeightLayout layout, StagingMode mode)
    : layout_(std::move(layout)), mode_(mode) {
  const int copies = mode == StagingMode::kDoubleBuffer ? 2 : 1;
  for (int i = 0; i < copies; ++i) {
    buffers_.push_back(std::make_shared<WeightBuffer>(layout_.total_bytes()));
  }
  // Tensors start at multiples of the layout's alignment (>= 4) and buckets
  // at multiples of bucket_bytes (a multiple of it): a slice never splits
  // an element of 2 or 4 bytes.
  float_pieces_.resize(layout_.num_buckets());
  const std::vector<TensorPlacement>& tensors = layout_.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::optional<kernels::FloatFormat> format =
        FloatFormatOf(tensors[t].info.dtype);
    if (!format.has_value() || tensors[t].info.byte_size == 0) continue;
    const uint64_t begin = tensors[t].offset;
    const uint64_t end = begin + tensors[t].info.byte_size;
    for (const BucketRange& b : layout_.buckets()) {
      const uint64_t from = std::max(begin, b.offset);
      const uint64_t to = std::min(end, b.offset + b.size);
      if (from >= to) continue;
      float_pieces_[b.index].push_back({t, from, to - from});
    }
  }
}

absl::Status StagingWeights::CheckFinite(const uint8_t* flat, uint32_t bucket,
                                         uint64_t version) const {
  for (const FloatPiece& piece : float_pieces_[bucket]) {
    if (absl::Status s =
            CheckTensorPieceFinite(version, layout_, piece.tensor, piece.offset,
                                   {flat + piece.offset, piece.size});
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StagingWeights::RefuseNonFinite(absl::Status why) {
  ++stats_.nonfinite_versions;
  if (!refused_version_.has_value() ||
      *refused_version_ < staged_.policy_version()) {
    refused_version_ = staged_.policy_version();
  }
  return Reject(std::move(why));
}

absl::Status StagingWeights::CheckDigest(uint8_t* flat,
                                         const v1::WeightManifest& staged,
                                         TrustedDigestSource* trusted) {
  const uint64_t version = staged.policy_version();
  const absl::Span<uint8_t> bytes(flat, layout_.total_bytes());
  std::function<void(uint64_t, absl::Span<uint8_t>)> tamper;
  {
    absl::MutexLock lock(&mu_);
    tamper = tamper_for_test_;
  }
  if (tamper) tamper(version, bytes);
  std::string expected = staged.sha256();
  if (trusted != nullptr) {
    absl::StatusOr<std::string> from_trusted = trusted->TrustedSha256(version);
    if (!from_trusted.ok()) {
      return absl::Status(
          from_trusted.status().code(),
          absl::StrCat("weights v", version,
                       ": no authenticated digest to check it against: ",
                       from_trusted.status().message()));
    }
    expected = *std::move(from_trusted);
  }
  if (expected.empty()) {
    absl::MutexLock lock(&mu_);
    ++stats_.unsigned_versions;
    return absl::OkStatus();
  }
  return VerifyWeightSha256(version, expected, bytes);
}

absl::Status StagingWeights::RefuseDigest(absl::Status why) {
  if (IsDigestMismatch(why)) ++stats_.digest_mismatches;
  return Reject(std::move(why));
}

void StagingWeights::SetTamperHookForTest(
    std::function<void(uint64_t version, absl::Span<uint8_t> flat)> tamper) {
  absl::MutexLock lock(&mu_);
  tamper_for_test_ = std::move(tamper);
}

WeightBuffer& StagingWeights::StagingBuffer() {
  return mode_ == StagingMode::kDoubleBuffer ? *buffers_[1 - live_index_]
                                             : *buffers_[live_index_];
}

absl::Status StagingWeights::Reject(absl::Status why) {
  state_ = State::kIdle;
  ++stats_.rejected_versions;
  if (gate_ != nullptr) gate_->EndWrite(std::nullopt);
  return why;
}

void StagingWeights::SetInplaceGate(InplaceWriteGate* gate) {
  absl::MutexLock lock(&mu_);
  gate_ = mode_ == StagingMode::kInplace ? gate : nullptr;
}

absl::Span<uint8_t> StagingWeights::inplace_buffer() {
  if (mode_ != StagingMode::kInplace) return {};
  return buffers_[0]->span();
}

bool StagingWeights::live_lost() const {
  absl::MutexLock lock(&mu_);
  return live_lost_;
}

absl::Status StagingWeights::Begin(const v1::WeightManifest& manifest,
                                   TrustedDigestSource* trusted) {
  if (absl::Status s = layout_.CheckSameLayout(manifest); !s.ok()) return s;
  const uint64_t v = manifest.policy_version();
  InplaceWriteGate* gate = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (live_version_.has_value() && v <= *live_version_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "weights v", v, " is not newer than the live v", *live_version_));
    }
    if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA) {
      if (!live_version_.has_value() ||
          *live_version_ != manifest.base_version()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "weights v", v, " is a delta on v", manifest.base_version(),
            " but the live version is ",
            live_version_.has_value() ? absl::StrCat("v", *live_version_)
                                      : std::string("none"),
            "; fetch a full version"));
      }
    } else if (manifest.kind() != v1::WEIGHT_PAYLOAD_KIND_FULL) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights v", v, ": payload kind unspecified"));
    }
    gate = gate_;
  }
  // A buffer that live_buffer() handed out and someone still holds (the
  // tensors of a version the engine may still generate with) is never
  // written: this version goes into a new one, and the old one is freed
  // with its last holder. Only this thread replaces buffers, and a buffer
  // that is not live cannot gain holders, so the count can only fall.
  std::shared_ptr<WeightBuffer> fresh;
  const WeightBuffer* held = nullptr;
  if (mode_ == StagingMode::kDoubleBuffer) {
    {
      absl::MutexLock lock(&mu_);
      const std::shared_ptr<WeightBuffer>& next = buffers_[1 - live_index_];
      if (next.use_count() > 1) held = next.get();
    }
    // Allocated unlocked: live() callers do not wait for it.
    if (held != nullptr) {
      fresh = std::make_shared<WeightBuffer>(layout_.total_bytes());
    }
  }
  // Unlocked: the gate may wait for the readers (the engine's step under
  // way). Only this (the receiving) thread calls Begin().
  if (gate != nullptr) {
    if (absl::Status s = gate->BeginWrite(v); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  if (fresh != nullptr && buffers_[1 - live_index_].get() == held) {
    buffers_[1 - live_index_] = std::move(fresh);
    ++stats_.staging_allocations;
  }
  staged_ = manifest;
  trusted_ = trusted;
  bucket_done_.assign(layout_.num_buckets(), false);
  bucket_checked_.assign(layout_.num_buckets(), 0);
  bucket_crc_.assign(layout_.num_buckets(), 0);
  buckets_left_ = layout_.num_buckets();
  state_ = State::kReceiving;
  if (mode_ == StagingMode::kInplace) {
    // Readers are paused (by the gate, or by the caller's contract); live
    // is being overwritten.
    live_version_.reset();
    live_manifest_.reset();
    live_lost_ = true;
  }
  return absl::OkStatus();
}

absl::Status StagingWeights::CheckReceivingFull(uint32_t bucket) const {
  if (state_ != State::kReceiving ||
      staged_.kind() != v1::WEIGHT_PAYLOAD_KIND_FULL) {
    return absl::FailedPreconditionError(
        "no FULL weights version is being received");
  }
  if (bucket >= layout_.num_buckets()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket ", bucket, " out of range (",
                     layout_.num_buckets(), " buckets)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<uint8_t>> StagingWeights::MutableBucket(
    uint32_t bucket) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckReceivingFull(bucket); !s.ok()) return s;
  const BucketRange& range = layout_.buckets()[bucket];
  return StagingBuffer().span().subspan(range.offset, range.size);
}

absl::Status StagingWeights::WriteBucketChunk(uint32_t bucket, uint64_t offset,
                                              absl::Span<const uint8_t> data) {
  uint8_t* dst = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckReceivingFull(bucket); !s.ok()) return s;
    const BucketRange& range = layout_.buckets()[bucket];
    if (offset > range.size || data.size() > range.size - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk of ", data.size(), " bytes at offset ", offset,
          " does not fit bucket ", bucket, " of ", range.size, " bytes"));
    }
    dst = StagingBuffer().data() + range.offset + offset;
    stats_.bytes_received += data.size();
  }
  // The staging buffer belongs to the receiver until FinishBucket.
  if (!data.empty()) std::memcpy(dst, data.data(), data.size());
  return absl::OkStatus();
}

absl::Status StagingWeights::ChecksumBucketPiece(uint32_t bucket,
                                                 uint64_t offset,
                                                 uint64_t size) {
  const uint8_t* data = nullptr;
  uint32_t crc = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckReceivingFull(bucket); !s.ok()) return s;
    const uint64_t bucket_size = layout_.buckets()[bucket].size;
    if (offset == 0) {
      bucket_checked_[bucket] = 0;
      bucket_crc_[bucket] = 0;
    }
    if (offset != bucket_checked_[bucket] || offset > bucket_size ||
        size > bucket_size - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", bucket, ": piece [", offset, ", ", offset + size,
          ") does not continue the ", bucket_checked_[bucket],
          " bytes checksummed of ", bucket_size));
    }
    data = StagingBuffer().data() + layout_.buckets()[bucket].offset + offset;
    crc = bucket_crc_[bucket];
  }
  // Unlocked, like FinishBucket: only this (the receiving) thread writes
  // these entries between Begin() calls.
  crc = kernels::Crc32cExtend(crc, data, size);
  absl::MutexLock lock(&mu_);
  bucket_crc_[bucket] = crc;
  bucket_checked_[bucket] = offset + size;
  return absl::OkStatus();
}

absl::Status StagingWeights::FinishBucket(uint32_t bucket,
                                          int checksum_threads) {
  const uint8_t* data = nullptr;
  v1::WeightManifest const* manifest = nullptr;
  uint64_t checked = 0;
  uint32_t crc = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckReceivingFull(bucket); !s.ok()) return s;
    if (bucket_done_[bucket]) return absl::OkStatus();
    data = StagingBuffer().data() + layout_.buckets()[bucket].offset;
    manifest = &staged_;
    checked = bucket_checked_[bucket];
    crc = bucket_crc_[bucket];
  }
  // Checksumming runs unlocked: staged_ only changes in Begin(), which the
  // receiver (this thread) calls.
  const uint64_t size = layout_.buckets()[bucket].size;
  if (checksum_threads > 1 && checked < size) {
    crc = kernels::Crc32cExtendParallel(crc, data + checked, size - checked,
                                        checksum_threads);
    checked = size;
  }
  absl::Status verified =
      VerifyBucket(*manifest, bucket, {data, size}, checked, crc);
  absl::Status finite = absl::OkStatus();
  if (verified.ok()) {
    finite = CheckFinite(data - layout_.buckets()[bucket].offset, bucket,
                         manifest->policy_version());
  }
  TrustedDigestSource* trusted = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!verified.ok()) return Reject(std::move(verified));
    if (!finite.ok()) return RefuseNonFinite(std::move(finite));
    bucket_done_[bucket] = true;
    if (--buckets_left_ > 0) return absl::OkStatus();
    trusted = trusted_;
  }
  // The last bucket: the whole version is in staging (only this thread
  // writes it until Begin()); hash it unlocked.
  // (data points into the staging buffer, which this thread owns.)
  absl::Status digest = CheckDigest(
      const_cast<uint8_t*>(data) - layout_.buckets()[bucket].offset, *manifest,
      trusted);
  absl::MutexLock lock(&mu_);
  if (!digest.ok()) return RefuseDigest(std::move(digest));
  state_ = State::kReady;
  return absl::OkStatus();
}

absl::Status StagingWeights::ApplyDelta(absl::Span<const uint8_t> delta) {
  uint8_t* staging = nullptr;
  const uint8_t* live = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kReceiving ||
        staged_.kind() != v1::WEIGHT_PAYLOAD_KIND_DELTA) {
      return absl::FailedPreconditionError(
          "no DELTA weights version is being received");
    }
    staging = StagingBuffer().data();
    live = buffers_[live_index_]->data();
    stats_.bytes_received += delta.size();
  }
  const uint64_t size = layout_.total_bytes();
  // Staging becomes a copy of the base (live); concurrent engine reads of
  // live are fine.
  if (staging != live) std::memcpy(staging, live, size);
  absl::Status applied = kernels::ApplyBf16Delta(
      delta, kernels::AsMutableWords({staging, size}), /*validate_first=*/true);
  if (applied.ok()) applied = VerifyWeights(staged_, {staging, size});
  absl::Status finite = absl::OkStatus();
  for (uint32_t b = 0; applied.ok() && finite.ok() && b < layout_.num_buckets();
       ++b) {
    finite = CheckFinite(staging, b, staged_.policy_version());
  }
  absl::Status digest = absl::OkStatus();
  if (applied.ok() && finite.ok()) {
    TrustedDigestSource* trusted = nullptr;
    {
      absl::MutexLock lock(&mu_);
      trusted = trusted_;
    }
    digest = CheckDigest(staging, staged_, trusted);
  }
  absl::MutexLock lock(&mu_);
  if (!finite.ok()) return RefuseNonFinite(std::move(finite));
  if (!digest.ok()) return RefuseDigest(std::move(digest));
  if (!applied.ok()) {
    return Reject(absl::Status(
        applied.code(), absl::StrCat("weights v", staged_.policy_version(),
                                     " delta rejected: ", applied.message())));
  }
  bucket_done_.assign(layout_.num_buckets(), true);
  buckets_left_ = 0;
  state_ = State::kReady;
  return absl::OkStatus();
}

void StagingWeights::Abort() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kIdle && gate_ != nullptr) gate_->EndWrite(std::nullopt);
  state_ = State::kIdle;
}

bool StagingWeights::ready() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kReady;
}

bool StagingWeights::WaitUntilTaken(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto taken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != State::kReady;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&taken), deadline);
}

absl::StatusOr<uint64_t> StagingWeights::Commit() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kReady) {
    return absl::FailedPreconditionError(
        "no verified weights version is staged");
  }
  if (mode_ == StagingMode::kDoubleBuffer) live_index_ = 1 - live_index_;
  live_version_ = staged_.policy_version();
  live_manifest_ = staged_;
  live_lost_ = false;
  state_ = State::kIdle;
  ++stats_.commits;
  if (gate_ != nullptr) gate_->EndWrite(live_version_);
  if (staged_.kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA) {
    ++stats_.delta_versions;
  } else {
    ++stats_.full_versions;
  }
  return *live_version_;
}

LiveWeights StagingWeights::live() const {
  absl::MutexLock lock(&mu_);
  return LiveWeights{buffers_[live_index_]->span(), live_version_};
}

std::shared_ptr<const WeightBuffer> StagingWeights::live_buffer() const {
  if (mode_ != StagingMode::kDoubleBuffer) return nullptr;
  absl::MutexLock lock(&mu_);
  if (!live_version_.has_value()) return nullptr;
  return buffers_[live_index_];
}

std::optional<uint64_t> StagingWeights::live_version() const {
  absl::MutexLock lock(&mu_);
  return live_version_;
}

std::optional<v1::WeightManifest> StagingWeights::live_manifest() const {
  absl::MutexLock lock(&mu_);
  return live_manifest_;
}

StagingStats StagingWeights::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status StagingWeights::CommitVerifiedElsewhere(
    const v1::WeightManifest& manifest,
    const std::function<absl::Status(absl::Span<uint8_t>)>& fill) {
  if (mode_ != StagingMode::kDoubleBuffer) {
    return absl::FailedPreconditionError(
        "a version verified elsewhere follows a double-buffered staging only");
  }
  if (manifest.kind() != v1::WEIGHT_PAYLOAD_KIND_FULL) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights v", manifest.policy_version(),
                     ": only a FULL version can be verified elsewhere"));
  }
  if (absl::Status s = Begin(manifest); !s.ok()) return s;
  uint8_t* staging = nullptr;
  {
    absl::MutexLock lock(&mu_);
    staging = StagingBuffer().data();
  }
  // The staging buffer belongs to this (the receiving) thread until Commit.
  const absl::Span<uint8_t> bytes(staging, layout_.total_bytes());
  absl::Status copied = fill(bytes);
  if (copied.ok()) copied = VerifyWeights(manifest, bytes);
  {
    absl::MutexLock lock(&mu_);
    if (!copied.ok()) {
      return Reject(absl::Status(
          copied.code(),
          absl::StrCat(
              "weights v", manifest.policy_version(),
              ": copy of a version verified elsewhere: ", copied.message())));
    }
    if (manifest.sha256().empty()) ++stats_.unsigned_versions;
    bucket_done_.assign(layout_.num_buckets(), true);
    buckets_left_ = 0;
    state_ = State::kReady;
  }
  return Commit().status();
}

StagingWeights::Refusal StagingWeights::RefusalOf(const absl::Status& why) {
  if (IsNonFiniteWeights(why)) return Refusal::kNonFinite;
  if (IsDigestMismatch(why)) return Refusal::kDigestMismatch;
  return Refusal::kCorrupt;
}

void StagingWeights::RecordRefusedElsewhere(uint64_t version, Refusal why,
                                            bool pull_again) {
  absl::MutexLock lock(&mu_);
  ++stats_.rejected_versions;
  if (why == Refusal::kNonFinite) ++stats_.nonfinite_versions;
  if (why == Refusal::kDigestMismatch) ++stats_.digest_mismatches;
  if (pull_again && why != Refusal::kNonFinite) return;
  if (!refused_version_.has_value() || *refused_version_ < version) {
    refused_version_ = version;
  }
}

std::optional<uint64_t> StagingWeights::refused_version() const {
  absl::MutexLock lock(&mu_);
  return refused_version_;
}

}  // namespace tandem::weights
