#pragma once

// GrpcPullReceiver: the worker's end of the catch-up (pull) path, a
// WeightReceiver over the tandem.v1.WeightServer service (weight_server.h).
//
// ReceiveNext() waits (until its deadline) for a manifest newer than the
// live version (any version before the first). With a live version it
// waits by long polls, GetManifest(latest, newer_than = live, wait_ms =
// the time left, at most options.long_poll), which the server holds until
// it has something newer (weight_server.h): an idle receiver makes one
// call per long_poll (or per ReceiveNext) instead of one per
// poll_interval. An answer that comes back sooner than poll_interval with
// nothing newer (an older server that ignores wait_ms, an error, a server
// shutting down) is followed by a pause until poll_interval has passed,
// as before long polls. Then it stages, in order of preference: the next
// delta on the live version (when live is at or past the latest anchor,
// or the version just before it: the server may hold a delta for an
// anchor too), otherwise the newest full version the server holds.
// A late joiner therefore fetches one full copy and then follows deltas.
// A version the staging refused for non-finite values, or one whose
// refusal after a device go-live was recorded there
// (StagingWeights::refused_version), is not fetched again: the receiver
// waits for a newer one and fetches it in full.
// Every chunk's CRC-32C is checked; a bad chunk or a broken stream resumes
// from the first unverified byte (up to max_attempts times without
// progress), and every bucket is verified against the manifest before the
// version can be committed.
//
// Raw data path: when the weight server announces a data port (GetManifest
// initial metadata, weight_server.h) and options.raw_data is set, streams
// are read over plain TCP from that port on the host gRPC reached, straight
// into the staging buckets, with the same chunk CRCs, resume points,
// retries, deadline and cancellation; a server without the data path, or
// a data port that cannot be reached, is read over FetchWeights.
//
// Shared-memory path (same host): with options.shared_memory, FULL payloads
// are requested with FetchWeightsRequest.shared_memory (on whichever path
// above is used). When the server answers with a segment
// (shared_weight_segment.h), it is opened read-only, checked (size, magic,
// version, token) and copied bucket by bucket into staging, where
// FinishBucket verifies every bucket's CRC-32C as on the socket paths (a
// bad bucket rejects the version). A segment that cannot be opened here
// (another host or container, /dev/shm not shared) or is not the one
// offered sends this and every later fetch of this receiver to the socket
// at once: stats().shm_fallbacks() counts it (split by why in
// shm_open_failures and shm_mismatches) and one debug line says why. A
// FULL version asked for in shared memory but streamed because the server
// offered no segment counts in stats().shm_not_offered.
//
// CUDA IPC path (same host, device memory; cuda_ipc.h): with
// options.cuda_ipc (a worker on a CUDA device), the first try of each FULL
// version goes over FetchWeights with cuda_ipc set (never the raw path: the
// server's lease on its buffer lasts as long as that call). An offer is
// checked (ValidateCudaIpcOffer: handle and token sizes, size against the
// manifest, boot id, a device this process sees), copied device-to-device
// by the sink, which closes the handle, and only then is the call ended;
// the staged copy is then read to the host bucket by bucket and verified
// by FinishBucket as on every other path (CRC-32C, finite values, SHA-256).
// An offer that fails a check or cannot be opened is logged (naming the
// field and value) and counted (stats().cuda_ipc_refused,
// cuda_ipc_open_failures), the call ended, and the same version streamed
// (or offered in shared memory) instead; the next version asks again. A
// server that offers nothing streams as usual (stats().cuda_ipc_not_offered).
// Handoff mode (options.cuda_ipc_handoff, with a sink that hands_over()):
// a version copied by the sink is not staged at all. ReceiveNext returns
// its version with nothing staged (staging is left as it was: Begin()'s
// checks passed, then Abort()), and TakeCudaIpcHandoff() gives its
// manifest; the caller takes the copy from the sink
// (CudaIpcSink::TakeStagedCopy), verifies it where it lies and makes it
// live (device_go_live.h), then brings the staging to that version
// (StagingWeights::CommitVerifiedElsewhere) or records its refusal
// (StagingWeights::RecordRefusedElsewhere), since the next Plan asks for
// versions newer than the staging's. Counted in stats().cuda_ipc_versions
// and cuda_ipc_bytes (the bytes copied device-to-device) like a staged
// copy.
// While the last FULL version asked for came by CUDA IPC, the receiver
// fetches each newer version in full (by CUDA IPC) instead of following
// deltas; after a refusal or a version not offered it follows deltas again
// until a FULL fetch (an anchor, a catch-up) comes by CUDA IPC.
//
// Interrupt() ends a ReceiveNext that is waiting for a newer version
// (nothing newer on the server yet) with Cancelled, as if its deadline had
// come, cancelling a long poll in flight; it never touches a transfer
// under way. A consumer whose reason to
// wait changed (e.g. a new broadcast epoch was announced) wakes it so.
//
// Thread-safety: ReceiveNext() from one thread; Cancel(), Interrupt() and
// stats() from any thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/weight_transport.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::weights {

struct PullOptions {
  // Requested chunk size; the server caps it (1 MiB by default).
  uint32_t chunk_bytes = 1u << 20;
  // Consecutive stream failures without progress before giving up.
  int max_attempts = 5;
  // How often at most to ask for a newer version while waiting.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // The longest one long-polled GetManifest may be held by the server
  // (which caps it at kMaxLongPollMs, 30 s); the wait is also bounded by
  // ReceiveNext's deadline. Zero: no long polls (ask every poll_interval).
  absl::Duration long_poll = absl::Seconds(10);
  // ReceiveNext's deadline bounds the wait for a newer version; once the
  // transfer of one has begun it may run until at least this long after it
  // began (Cancel() still stops it at once).
  absl::Duration transfer_timeout = absl::Seconds(60);
  // Use the server's raw data path when it announces one.
  bool raw_data = true;
  // Chunk size on the raw data path; 0 (default) asks for whole buckets,
  // each checked once against its manifest CRC (a mismatch rejects the
  // version, as a bad bucket does; a broken connection resumes from the
  // bucket's start). Smaller chunks carry their own CRC, are refetched
  // when it does not match, and resume at the chunk.
  uint32_t raw_chunk_bytes = 0;
  // Ask for FULL payloads as shared-memory segments (same host); falls
  // back to the socket paths when the server offers none or it cannot be
  // opened here.
  bool shared_memory = true;
  // Ask for FULL payloads in the server's device memory (CUDA IPC, see
  // above); null (a CPU worker): never asked. Must outlive the receiver.
  CudaIpcSink* cuda_ipc = nullptr;
  // Hand a version copied by CUDA IPC over instead of staging it (see
  // "Handoff mode" above); only when cuda_ipc->hands_over().
  bool cuda_ipc_handoff = false;
  // Raw data path authentication (data_plane_auth.h): the key this
  // process holds now, set by whoever talks to the coordinator. When set,
  // the receiver answers the server's challenge with a proof before its
  // request (made with the previous epoch's key, in its grace, when the
  // server challenges for that epoch); while it holds no key, or when the
  // server refuses the proof (a stale epoch) or speaks without a challenge,
  // that stream goes over FetchWeights instead (gRPC, under mTLS), logged
  // once per cause. Unset: the raw path as without TLS.
  std::shared_ptr<const DataPlaneKeyHolder> data_plane_key;
  // The clock of the wait for a newer version: ReceiveNext's deadline is a
  // time on it, and it times the poll_interval pauses and the wait_ms a
  // long poll asks for. The gRPC and socket deadlines of the calls are real
  // time, as long from now as the deadline is on this clock, so a fake
  // clock never stops a real call from ending. Must outlive the receiver.
  Clock* clock = RealClock();
};

struct PullStats {
  uint64_t versions = 0;
  uint64_t bytes = 0;
  uint64_t resumes = 0;            // streams restarted mid-payload
  uint64_t chunk_crc_errors = 0;   // chunks discarded for a bad CRC
  uint64_t raw_streams = 0;        // streams read over the raw data path
  uint64_t grpc_streams = 0;       // streams read over FetchWeights
  uint64_t shm_versions = 0;       // versions copied from shared memory
  uint64_t shm_bytes = 0;          // bytes copied from shared memory
  // Offered segments not usable here, by why:
  uint64_t shm_open_failures = 0;  // could not be opened (another host)
  uint64_t shm_mismatches = 0;     // not the one offered (size, token)
  uint64_t shm_not_offered = 0;    // asked for, streamed instead
  uint64_t cuda_ipc_versions = 0;  // versions copied by CUDA IPC
  uint64_t cuda_ipc_bytes = 0;     // bytes copied by CUDA IPC
  // CUDA IPC offers not used, by why (the version was streamed instead):
  uint64_t cuda_ipc_refused = 0;        // failed ValidateCudaIpcOffer
  uint64_t cuda_ipc_open_failures = 0;  // the sink could not open or copy
  uint64_t cuda_ipc_not_offered = 0;    // asked for, streamed instead
  uint64_t raw_auth_fallbacks = 0;  // raw streams refused or not tried for
                                    // want of a good data-plane key
  // Sealed raw streams given up because a record failed its tag
  // (weight_server.h, "Raw data path confidentiality"); the rest of the
  // version came over FetchWeights.
  uint64_t raw_decrypt_failures = 0;

  uint64_t shm_fallbacks() const { return shm_open_failures + shm_mismatches; }
};

class GrpcPullReceiver : public WeightReceiver {
 public:
  GrpcPullReceiver(std::shared_ptr<grpc::ChannelInterface> channel,
                   PullOptions options);

  absl::StatusOr<uint64_t> ReceiveNext(StagingWeights* staging,
                                       absl::Time deadline) override;
  void Cancel() override;
  // Ends the current ReceiveNext's wait for a newer version: it returns
  // CancelledError("... interrupted") at once, and later calls work as
  // before. A no-op while a version is being transferred (the call returns
  // that version). Made while no ReceiveNext waits, it ends the next one's
  // wait instead (if that finds nothing newer right away), so a wake just
  // before the call is not lost.
  void Interrupt();

  // Fetches exactly the payload `manifest` describes into `staging`.
  absl::Status Fetch(StagingWeights* staging,
                     const v1::WeightManifest& manifest, absl::Time deadline);

  PullStats stats() const;

  // Handoff mode: the manifest of the version the last ReceiveNext left
  // in the sink instead of staging it, once (empty otherwise). Call after
  // each successful ReceiveNext, on its thread.
  std::optional<v1::WeightManifest> TakeCudaIpcHandoff();

 private:
  // With wait > 0 (version 0 only): a long poll for a latest version
  // newer than `newer_than`; Cancel() and Interrupt() cancel it, and it
  // is not sent at all when either came first (Cancelled). `deadline`,
  // as Plan's, is on options.clock.
  absl::StatusOr<v1::WeightManifest> GetManifest(
      uint64_t version, absl::Time deadline, uint64_t newer_than = 0,
      absl::Duration wait = absl::ZeroDuration());
  // The manifest of the payload to fetch next, or DeadlineExceeded when
  // nothing newer than live appears before `deadline`.
  absl::StatusOr<v1::WeightManifest> Plan(StagingWeights* staging,
                                          absl::Time deadline);
  // Reads one stream from the resume point; advances it past every chunk
  // written. Returns the stream's status. A non-null `segment` asks for
  // the shared-memory path: when the server offers a segment it is stored
  // there (nothing else is read) and OK returned. A non-null `ipc` asks for
  // the CUDA IPC path: when the server offers device memory, the offer is
  // checked and copied (CopyCudaIpcOffer) while the call is open, *ipc set
  // to how that went, the call ended and OK returned.
  absl::Status ReadStream(StagingWeights* staging,
                          const v1::WeightManifest& manifest,
                          absl::Time deadline, uint32_t* bucket,
                          uint64_t* offset, std::vector<uint8_t>* delta,
                          std::optional<v1::SharedWeightSegment>* segment,
                          std::optional<absl::Status>* ipc = nullptr);
  // Whether the next version should be fetched in full by CUDA IPC.
  bool PreferCudaIpc() const;
  // Checks `offer` and has the sink copy it (see above).
  absl::Status CopyCudaIpcOffer(const v1::CudaIpcOffer& offer,
                                const v1::WeightManifest& manifest);
  // Reads what the sink staged into `staging` from the resume point on,
  // verifying each bucket.
  absl::Status StageCudaIpcCopy(StagingWeights* staging,
                                const v1::WeightManifest& manifest,
                                uint32_t* bucket, uint64_t* offset);
  // The same over the raw data path. Sets *connected when a connection to
  // the data port was made (false: use FetchWeights instead).
  absl::Status ReadRawStream(StagingWeights* staging,
                             const v1::WeightManifest& manifest,
                             absl::Time deadline, uint32_t* bucket,
                             uint64_t* offset, std::vector<uint8_t>* delta,
                             std::optional<v1::SharedWeightSegment>* segment,
                             bool* connected);
  // Copies a FULL payload from the resume point on out of an offered
  // segment, verifying each bucket. Sets *opened when the segment was
  // opened and matched the offer (false: use the socket instead).
  absl::Status CopySharedSegment(StagingWeights* staging,
                                 const v1::WeightManifest& manifest,
                                 const v1::SharedWeightSegment& segment,
                                 absl::Time deadline, uint32_t* bucket,
                                 uint64_t* offset, bool* opened);
  // Reads exactly n bytes from the active raw socket before `deadline`.
  absl::Status RawRead(int fd, void* dst, size_t n, absl::Time deadline);
  bool cancelled() const;
  // The real time as far from now as `deadline` is on options.clock (the
  // deadline itself with the real clock): for gRPC and socket deadlines.
  absl::Time RealDeadline(absl::Time deadline) const;

  std::unique_ptr<v1::WeightServer::Stub> stub_;
  const PullOptions options_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Interrupt() made outside a transfer, not yet taken by a wait.
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  // ReceiveNext is fetching a version (Interrupt() is a no-op).
  bool transferring_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The long-polled GetManifest in flight.
  grpc::ClientContext* polling_ ABSL_GUARDED_BY(mu_) = nullptr;
  int active_fd_ ABSL_GUARDED_BY(mu_) = -1;
  // Announced by the last GetManifest answer (port 0: none).
  std::string data_host_ ABSL_GUARDED_BY(mu_);
  uint16_t data_port_ ABSL_GUARDED_BY(mu_) = 0;
  // An offered segment could not be used here: socket paths from now on.
  bool shm_off_ ABSL_GUARDED_BY(mu_) = false;
  PullStats stats_ ABSL_GUARDED_BY(mu_);
  // The last FULL version asked for by CUDA IPC came so: later versions
  // are fetched in full (by CUDA IPC) rather than as deltas.
  bool ipc_preferred_ ABSL_GUARDED_BY(mu_) = false;
  // The device of the last CUDA IPC offer (ReceiveNext's thread only).
  std::string ipc_offer_device_;
  // The version handed over by the last Fetch (ReceiveNext's thread only).
  std::optional<v1::WeightManifest> handed_off_;
};

}  // namespace tandem::weights
