#pragma once

// StagingWeights: the rollout worker's side of a weight update. A transport
// receives version v into a staging buffer in the background while the
// engine keeps generating from the live buffer; at a decode-step boundary
// the engine calls Commit(), which swaps the two buffers by pointer (the
// pause is a swap, not a copy). Every bucket is checked against the
// manifest's CRC-32C before the version can be committed; a mismatch
// rejects the whole version and leaves the live weights untouched.
//
// Finite check: every floating-point tensor (F32, BF16, F16) of a version
// must hold only finite values. A CRC proves the bytes are the ones the
// trainer sent, not that they are weights anyone should run: a version
// with an Inf or a NaN (a diverged step, corruption before the checksum
// was taken) is refused like a bad bucket (DataLoss naming the version,
// the tensor and the element; counted in stats().nonfinite_versions, its
// version kept in refused_version() so receivers wait for a newer one
// instead of fetching it again), and the live weights stay. The scan runs
// on the receiving thread, per bucket as it is verified (for a delta, over
// the whole result), never during Commit(), so the engine's pause does not
// grow; it reads each byte once at memory bandwidth
// (tests/bench/finite_scan_bench.cc).
//
// Digest check: when every bucket verified (for a delta, after it was
// applied), the whole staged buffer is hashed with SHA-256 and compared
// with the version's expected digest (weight_digest.h). The CRC-32C catches
// accidents; an attacker who can write into an unauthenticated stream can
// match it, not the digest. The expected digest is the staged manifest's
// `sha256` (pull paths: that manifest came over gRPC), or, when Begin() got
// a TrustedDigestSource (broadcast: the manifest came in-band, over the
// unauthenticated pair sockets), the digest that source fetched over the
// authenticated plane. A mismatch rejects the version like a bad bucket
// (DataLoss "... sha256 mismatch ...", IsDigestMismatch(); counted in
// stats().digest_mismatches). An empty expected digest (a trainer that
// predates it) keeps the CRC-only behaviour and is counted in
// stats().unsigned_versions. The hash runs on the receiving thread, never
// in Commit().
//
// Modes:
//   kDoubleBuffer  two buffers (live + staging); receive never disturbs live.
//   kInplace       one buffer, for when memory cannot hold two copies: the
//                  transport writes straight into live. Every reader of the
//                  buffer must be paused from Begin() until Commit(): an
//                  InplaceWriteGate (SetInplaceGate) does that, Begin()
//                  passes through it before the first byte is written.
//                  Live is invalid (live_version() empty, live_lost() true)
//                  from Begin() until Commit(); after a rejected or broken
//                  version it stays invalid until a later version (in
//                  practice a FULL one) is committed.
//
// Protocol (receiver side): Begin(manifest), then for a FULL manifest every
// bucket is written (MutableBucket() for zero-copy receipt, or
// WriteBucketChunk()) and sealed with FinishBucket(); for a DELTA manifest
// one ApplyDelta(). ready() turns true after the last bucket verifies.
//
// Thread-safety: one receiver thread calls the receiver-side methods; one
// engine thread calls Commit() and live(). They may run concurrently. The
// span returned by live() stays valid until the engine's next Commit() (or,
// in kInplace mode, the next Begin()); the engine must not keep it across
// those calls. A span from MutableBucket() is valid until the next Begin(),
// Abort() or failure. Small state is guarded by an internal mutex; bulk
// bytes are written without it, into the buffer only the receiver owns.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_buffer.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

enum class StagingMode { kDoubleBuffer, kInplace };

// Pauses the readers of a kInplace buffer while a transport writes into it.
// StagingWeights calls BeginWrite() from Begin(), after the manifest passed
// its checks and before any byte is written: it blocks until no reader
// uses the buffer and keeps readers out; an error fails Begin() with
// nothing written. EndWrite() follows when the version is committed
// (`live` = its version: readers may resume) or dropped (rejected,
// aborted: `live` empty; the buffer holds no valid weights and readers
// must stay out until a later EndWrite with a version). Called on the
// receiving thread; EndWrite may be called with StagingWeights' internal
// mutex held, so a gate must never call back into the StagingWeights.
class InplaceWriteGate {
 public:
  virtual ~InplaceWriteGate() = default;
  virtual absl::Status BeginWrite(uint64_t version) = 0;
  virtual void EndWrite(std::optional<uint64_t> live) = 0;
};

// Where the expected SHA-256 of a version comes from when the manifest the
// bytes arrived with is not trusted (a broadcast's in-band manifest).
// Called on the receiving thread, once per version, after every bucket
// verified; may block on an RPC.
class TrustedDigestSource {
 public:
  virtual ~TrustedDigestSource() = default;
  // The `sha256` of `version`'s manifest as received over the
  // authenticated plane; "" when that manifest carries none. An error
  // rejects the version.
  virtual absl::StatusOr<std::string> TrustedSha256(uint64_t version) = 0;
};

struct LiveWeights {
  absl::Span<const uint8_t> bytes;
  std::optional<uint64_t> version;  // empty: no valid weights yet
};

struct StagingStats {
  uint64_t commits = 0;
  uint64_t rejected_versions = 0;  // failed verification or bad payload
  uint64_t nonfinite_versions = 0;  // of those, refused for Inf/NaN values
  uint64_t digest_mismatches = 0;  // of those, refused for a SHA-256 mismatch
  uint64_t unsigned_versions = 0;  // verified without a digest (old trainer)
  uint64_t bytes_received = 0;     // bucket bytes and delta bytes
  uint64_t full_versions = 0;
  uint64_t delta_versions = 0;
  // kDoubleBuffer: versions received into a new buffer because the old
  // staging buffer was still held (see live_buffer()).
  uint64_t staging_allocations = 0;
};

class StagingWeights {
 public:
  static absl::StatusOr<std::unique_ptr<StagingWeights>> Create(
      FlatWeightLayout layout, StagingMode mode);

  StagingWeights(const StagingWeights&) = delete;
  StagingWeights& operator=(const StagingWeights&) = delete;

  const FlatWeightLayout& layout() const { return layout_; }
  StagingMode mode() const { return mode_; }

  // kInplace only: the gate that pauses the buffer's readers (see
  // InplaceWriteGate). REQUIRES: set before the first Begin(); `gate`
  // outlives this object or is reset to nullptr first.
  void SetInplaceGate(InplaceWriteGate* gate);

  // kInplace only: the one buffer (its address never changes), for
  // building tensors that view the live weights and for filling it with
  // the initial weights before the first Begin(). Empty in kDoubleBuffer
  // mode. Writing to it after Begin() bypasses verification: don't.
  absl::Span<uint8_t> inplace_buffer();

  // kInplace: true from Begin() until the next Commit(): the buffer was
  // (partly) overwritten and holds no verified version, so readers must
  // not use it until a version is received again. Always false in
  // kDoubleBuffer mode.
  bool live_lost() const;

  // ---- Receiver side ----

  // Starts receiving `manifest`'s version, discarding any version staged
  // and not yet committed. FailedPrecondition when the layout differs, the
  // version is not newer than live, or a DELTA's base_version is not the
  // live version. `trusted`, when not null, supplies the expected SHA-256
  // instead of `manifest` (see "Digest check"); it must outlive the
  // version's receipt.
  absl::Status Begin(const v1::WeightManifest& manifest,
                     TrustedDigestSource* trusted = nullptr);

  // Writable bytes of `bucket` for a FULL version being received.
  absl::StatusOr<absl::Span<uint8_t>> MutableBucket(uint32_t bucket);

  // Copies `data` to `offset` inside `bucket` of the FULL version being
  // received. InvalidArgument when it does not fit.
  absl::Status WriteBucketChunk(uint32_t bucket, uint64_t offset,
                                absl::Span<const uint8_t> data);

  // Checksums bytes [offset, offset + size) of `bucket` (already written)
  // while they are still in cache, so that FinishBucket() only reads what
  // no piece covered. Pieces of a bucket must come in order without gaps
  // (InvalidArgument otherwise); a piece at offset 0 starts the bucket over
  // (a resumed stream re-reads it). Only FinishBucket() decides.
  absl::Status ChecksumBucketPiece(uint32_t bucket, uint64_t offset,
                                   uint64_t size);

  // Verifies `bucket`. On a CRC mismatch returns DataLoss naming the bucket
  // and both checksums and rejects the version (Begin() again to retry).
  // `checksum_threads` > 1 splits the checksum of what no piece covered
  // across that many threads (kernels::Crc32cExtendParallel): for the last
  // bucket of a version, when no transfer is left to overlap with.
  absl::Status FinishBucket(uint32_t bucket, int checksum_threads = 1);

  // Applies an encoded delta (kernels/bf16_delta.h) for a DELTA version:
  // the staging buffer becomes live + delta, then every bucket is
  // verified. DataLoss / InvalidArgument reject the version.
  absl::Status ApplyDelta(absl::Span<const uint8_t> delta);

  // Drops the version being received or staged.
  void Abort();

  // Test-only seam: `tamper` is called on the receiving thread with the
  // whole staged buffer of a version just before its digest check (after
  // every bucket's CRC-32C verified), to play an attacker who altered the
  // bytes in flight. Never set outside tests.
  void SetTamperHookForTest(
      std::function<void(uint64_t version, absl::Span<uint8_t> flat)> tamper);

  // ---- A version verified elsewhere (device_go_live.h) ----
  //
  // A worker that verified a version where its bytes lie (a CUDA IPC copy
  // in device memory: CRC-32C of every bucket, the finite check and the
  // trusted SHA-256, GoLiveFromStagedTensor) and made it live from there
  // keeps this (host) staging at that version, so that receivers plan from
  // it (Plan asks for versions newer than live_version()) and deltas apply
  // to its bytes.

  // Makes the FULL version of `manifest` live: Begin()'s checks, then
  // `fill` writes the version's bytes into the staging buffer (on the
  // receiving thread, unlocked; an error drops the version), then each
  // bucket's CRC-32C is checked against `manifest` and the version is
  // committed (DataLoss: the copy differs from the bytes verified; the
  // version is rejected and live stays). The finite check and the SHA-256
  // are not run again: REQUIRES the caller verified these same bytes
  // against this same manifest (and its trusted digest) already. Those
  // checks guard against bad weights and against bytes altered on an
  // unauthenticated network path; a copy within this process of bytes that
  // passed them has neither, and the CRC-32C catches a copy gone wrong.
  // An empty manifest `sha256` is counted in stats().unsigned_versions,
  // as the receive path counts it. kDoubleBuffer only (FailedPrecondition
  // otherwise). Counted as a commit, not in bytes_received.
  absl::Status CommitVerifiedElsewhere(
      const v1::WeightManifest& manifest,
      const std::function<absl::Status(absl::Span<uint8_t>)>& fill);

  // Why a version verified elsewhere was refused.
  enum class Refusal { kCorrupt, kNonFinite, kDigestMismatch };
  // The Refusal of a verification's error: kNonFinite for
  // IsNonFiniteWeights, kDigestMismatch for IsDigestMismatch, else
  // kCorrupt.
  static Refusal RefusalOf(const absl::Status& why);
  // Counts `version`'s refusal as the receive path would (rejected_versions,
  // and nonfinite_versions or digest_mismatches) and keeps it in
  // refused_version(), so that receivers wait for a newer version instead
  // of fetching this one again: its bytes came from the trainer's own copy,
  // which a second fetch would copy again. With `pull_again` (a broadcast
  // refused for a corrupt copy or a digest mismatch: bytes that crossed the
  // pair sockets, which the trainer's own copy may not share) it is only
  // counted, and receivers fetch it; a non-finite version is always kept.
  void RecordRefusedElsewhere(uint64_t version, Refusal why,
                              bool pull_again = false);

  // ---- Engine side ----

  // True when a verified version waits for Commit().
  bool ready() const;

  // Blocks until no verified version waits for Commit() (returns true) or
  // `deadline` passes (returns false). For the receiving thread, which
  // receives the next version only after the engine took the last one.
  bool WaitUntilTaken(absl::Time deadline) const;

  // Makes the staged version live and returns it. FailedPrecondition when
  // nothing verified is staged.
  absl::StatusOr<uint64_t> Commit();

  LiveWeights live() const;
  // kDoubleBuffer: the live version's buffer, shared, for tensors that view
  // it instead of copying it (weights::ViewFlatModel). The staging never
  // writes into a buffer while anyone else holds it (Begin() receives into
  // a new one instead), so its bytes stay the live version's for as long
  // as the caller keeps it. Null in kInplace mode (whose one buffer is
  // rewritten in place; see inplace_buffer()) and while nothing is live.
  std::shared_ptr<const WeightBuffer> live_buffer() const;
  std::optional<uint64_t> live_version() const;

  // The manifest of the live version (empty when there is none).
  std::optional<v1::WeightManifest> live_manifest() const;

  StagingStats stats() const;

  // The newest version refused for non-finite values (see above), or by a
  // verification made elsewhere (RecordRefusedElsewhere), if any.
  // A receiver asks for versions newer than max(live, refused): the
  // trainer's copy of a refused version is no better the second time.
  std::optional<uint64_t> refused_version() const;

 private:
  enum class State { kIdle, kReceiving, kReady };

  StagingWeights(FlatWeightLayout layout, StagingMode mode);
  WeightBuffer& StagingBuffer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Reject(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckReceivingFull(uint32_t bucket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The refusal of finite_weights.h for the first non-finite value of a
  // floating-point tensor in `bucket` of `flat` (a whole version's
  // buffer), else OK.
  absl::Status CheckFinite(const uint8_t* flat, uint32_t bucket,
                           uint64_t version) const;
  // The digest check of the whole staged buffer (see "Digest check").
  // Receiving thread, unlocked.
  absl::Status CheckDigest(uint8_t* flat, const v1::WeightManifest& staged,
                           TrustedDigestSource* trusted);
  // Reject() for a version refused by CheckDigest.
  absl::Status RefuseDigest(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reject() for a version refused by CheckFinite.
  absl::Status RefuseNonFinite(absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A slice of a floating-point tensor inside one bucket.
  struct FloatPiece {
    size_t tensor;       // index in layout_.tensors()
    uint64_t offset;     // in the flat buffer
    uint64_t size;       // bytes
  };

  const FlatWeightLayout layout_;
  const StagingMode mode_;
  // Per bucket, the floating-point tensor slices it holds (immutable).
  std::vector<std::vector<FloatPiece>> float_pieces_;

  mutable absl::Mutex mu_;
  // buffers_[live_index_] is live; in kDoubleBuffer the other is staging,
  // in kInplace there is one buffer that is both. The vector's size never
  // changes; in kDoubleBuffer Begin() may replace the staging buffer (under
  // mu_, on the receiving thread; see live_buffer()), kInplace's never
  // changes (inplace_buffer() reads it unlocked).
  std::vector<std::shared_ptr<WeightBuffer>> buffers_;
  int live_index_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> live_version_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::WeightManifest> live_manifest_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  v1::WeightManifest staged_ ABSL_GUARDED_BY(mu_);
  TrustedDigestSource* trusted_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::function<void(uint64_t, absl::Span<uint8_t>)> tamper_for_test_
      ABSL_GUARDED_BY(mu_);
  std::vector<bool> bucket_done_ ABSL_GUARDED_BY(mu_);
  // Per bucket: bytes ChecksumBucketPiece() covered and their CRC-32C.
  std::vector<uint64_t> bucket_checked_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> bucket_crc_ ABSL_GUARDED_BY(mu_);
  uint32_t buckets_left_ ABSL_GUARDED_BY(mu_) = 0;
  StagingStats stats_ ABSL_GUARDED_BY(mu_);
  InplaceWriteGate* gate_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool live_lost_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint64_t> refused_version_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
