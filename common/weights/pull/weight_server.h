#pragma once

// WeightServerService: the trainer's end of the catch-up (pull) path, the
// tandem.v1.WeightServer gRPC service over a WeightStore.
//
// FetchWeights streams one payload in chunks of at most max_chunk_bytes
// (1 MiB by default, well under gRPC's 4 MiB message limit), each carrying
// its CRC-32C. Addressing:
//   FULL payloads:  (bucket, offset inside the bucket); a chunk never
//                   crosses a bucket boundary and the last chunk of each
//                   bucket has bucket_complete set.
//   DELTA payloads: the encoded delta is one blob addressed as bucket 0,
//                   offset = byte offset in the blob; bucket_complete marks
//                   its last chunk.
// A client resumes a broken stream by asking again from the first byte it
// has not verified (start_bucket, start_offset).
//
// Status codes: NOT_FOUND for a version/kind no longer retained,
// INVALID_ARGUMENT for a resume point outside the payload.
//
// Raw data path. gRPC's per-message costs (HTTP/2 framing, copies into and
// out of protobuf messages) cap a stream at a fraction of what a plain
// socket moves (docs/benchmarks.md), so the service also serves the same
// streams over plain TCP: it listens on data_host:data_port and announces
// the port in GetManifest's initial metadata (kDataPortMetadata); a
// GrpcPullReceiver that sees it connects to that port on the host it
// reached gRPC on, and falls back to FetchWeights when it cannot. One
// connection carries one stream:
//   request:  u32 kRawMagic, u32 n, n bytes of a serialized
//             FetchWeightsRequest (same fields and resume semantics);
//   response: u32 kRawMagic, u32 absl status code, u32 m, m bytes of error
//             message; then, when OK, chunks, each a RawChunkHeader
//             followed by `size` data bytes, and finally a header with
//             kRawEnd set and size 0.
// Chunks are the gRPC stream's (same addressing, CRC-32C per chunk,
// bucket_complete) but carry no copies: the server writes header and
// payload bytes with one sendmsg, the receiver reads straight into its
// staging bucket. The chunk size is not capped by max_chunk_bytes, and
// chunk_bytes 0 asks for whole buckets: a chunk that is a whole bucket of
// a FULL payload carries the manifest's bucket CRC (not recomputed here),
// which the receiver checks once, as the bucket's verification. All
// integers little-endian. Fault injection and stats cover both paths.
//
// Shared-memory path (same host). A request with shared_memory set for a
// FULL payload, to a service with options.shared_memory, is answered with
// the payload's shared-memory segment (WeightStore::SharedFull) instead of
// the bytes: on gRPC one
// WeightChunk with shared_memory set and no data; on the raw path one
// RawChunkHeader with kRawSharedSegment set, `size` bytes of a serialized
// SharedWeightSegment (crc32c its CRC-32C), then the connection ends. The
// client maps the segment and copies from the resume point on; a client
// that cannot open it asks again without shared_memory. When no segment
// can be made (e.g. /dev/shm full) the bytes are streamed as usual. The
// service removes stale segments of dead processes when it starts and the
// store's segments when it is destroyed. Who copies the payload into the
// segment is the store's mode: kAtPut (the trainer) copies at publish, on
// the publisher's thread, so serving an offer copies nothing; kOnRequest
// copies on the first request for a version, on the thread that serves it
// (for FetchWeights, the reactor's callback thread: one copy per version).
//
// CUDA IPC path (same host, cuda_ipc.h). A FetchWeights request with
// cuda_ipc set for a FULL payload from its start, to a service with
// options.cuda_ipc holding that version in device memory, from a client on
// this host (same boot id), is answered with one WeightChunk carrying a
// CudaIpcOffer and no data; the call then stays open, holding a lease on
// the buffer (it outlives the ring's eviction of the version), until the
// client ends it (cancels: it has copied) or its deadline passes or its
// connection drops; Shutdown() ends such calls too (UNAVAILABLE). Anything
// else (no device copy of that version, another host, a resume point, the
// raw data path) is answered as without the field. Offers are counted in
// stats().cuda_ipc_offers, open leases in stats().cuda_ipc_leases.
//
// Raw data path authentication. With options.data_plane_key set (the
// trainer sets it under tls.mode mtls), the server speaks first on every raw
// connection: a challenge for the current data-plane epoch with a fresh
// nonce (data_plane_auth.h), and the client must answer it with a proof
// made with that epoch's secret before its request. A connection whose
// first bytes are not a proof (a client without the secret sends its
// request), whose proof is for another epoch (a stale secret; the
// previous epoch too, even in its grace: that key only opens, never
// admits), is wrong (garbage) or is cut short (the peer closed) is answered UNAUTHENTICATED
// in the raw status format and closed at once, logged with the peer's
// address (at most one line a second) and counted as tandem_weight_sync_data_connections_dropped_total
// {reason="unauthenticated"|"stale_epoch"}; a connection that sends part
// of a proof and stops is closed at data_request_timeout like any idle
// one. While the holder has no key yet every connection is refused
// ({reason="no_secret"}).
//
// Raw data path confidentiality. On a proven connection everything the
// server sends after the proof (the status, the chunk headers and the
// chunks) is sealed (data_plane_seal.h): AES-256-GCM under
// HKDF(epoch secret, salt = the challenge's 32-byte nonce, "raw"), cut into
// records of at most kRawSealedRecordBytes of that byte stream:
//
//   u32 n, n bytes of ciphertext, 16-byte tag    (record k: nonce k, AAD n)
//
// numbered from 0 on the connection. The nonce is fresh per connection, so
// the key is too, and record numbers never repeat under it. The client
// opens each record before it reads a byte of it; a record whose tag fails
// (tampered, reordered, cut) ends the stream and the pull goes on over
// FetchWeights. The request itself (version, resume point) travels in the
// clear, as does everything without a data-plane key (tls.mode off).
//
// Raw data path bounds: whatever its clients do (idle sockets, requests
// sent a byte a minute, receivers that stop reading), the raw path holds at
// most max_data_connections connections and 1 + data_stream_threads
// threads: one event loop accepts connections and reads requests (each
// within data_request_timeout), a fixed pool streams the answers (a send
// that makes no progress for data_send_timeout drops the stream), and
// requests wait in a queue for a free thread. A connection over the cap
// evicts the oldest one that has not sent its request yet, or is closed at
// once when every slot is queued or streaming; a receiver that finds its
// connection closed retries, and falls back to FetchWeights. accept()
// failures (EMFILE...) close the oldest idle connection and pause
// accepting with a back-off. Connections closed unserved are counted by
// reason (stats(), WeightSyncMetrics).
//
// Long-polled GetManifest. A request for the latest manifest
// (policy_version 0) with wait_ms > 0 is not answered while the store's
// latest version is <= newer_than: the reactor is kept in a list (no gRPC
// thread waits) and answered, as an immediate request would be, when a
// Put makes the latest version newer (WeightStore listener), when
// min(wait_ms, kMaxLongPollMs) has passed on options.clock, when the
// client cancels (its gRPC deadline, real time, included), or on
// Shutdown() (and destruction). One small thread per service finishes
// them, so the storing thread only flags the change. A gRPC server's
// Shutdown waits for calls in flight: call the service's Shutdown() first
// (the trainer does), or give the server's Shutdown a deadline (which
// cancels them).
//
// Roles. With options.tls_enabled (the trainer's tls.mode mtls), every
// GetManifest and FetchWeights call is checked against the caller's client
// certificate (common/rpc/peer_identity.h): trainer, rollout and admin
// identities may read weights (kWeightReaderRoles); any other role is
// answered PERMISSION_DENIED and a call without an identity
// UNAUTHENTICATED, before anything is read from the store (no manifest, no
// data port, no byte), each counted in options.auth_refused{reason}.
//
// Thread-safety: all methods may be called concurrently. Chunks are built
// (one memcpy and CRC of <= 1 MiB) on the reactor's callback thread; the
// reactor never waits on anything else. The destructor closes every raw
// connection and joins the raw path's threads.

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/rpc/peer_identity.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace prometheus {
class Counter;
template <typename T>
class Family;
}  // namespace prometheus

namespace tandem::weights {

// Certificate roles that may call GetManifest and FetchWeights under mTLS:
// the trainer (its own tools), rollout workers (the catch-up path) and
// admins (tandemctl). Verifiers and the coordinator never read weights.
inline constexpr rpc::PeerRoleSet kWeightReaderRoles{
    rpc::PeerRole::kTrainer, rpc::PeerRole::kRollout, rpc::PeerRole::kAdmin};

struct WeightServerOptions {
  uint32_t max_chunk_bytes = 1u << 20;
  // Optional: every chunk sent is counted as tandem_weight_sync_bytes_total
  // {direction="sent", transport="pull", kind}, every GetManifest as
  // tandem_weight_sync_manifest_requests_total{wait}. Must outlive the
  // service.
  WeightSyncMetrics* metrics = nullptr;
  // Raw data path: address to listen on (port 0 picks a free port); an
  // empty host disables it (pulls then use FetchWeights only). A listener
  // that cannot be opened is logged to stderr and disables it too.
  std::string data_host = "127.0.0.1";
  uint16_t data_port = 0;
  // Offer FULL payloads as shared-memory segments to clients that ask
  // (same host); off by default here, the trainer turns it on
  // (weight_sync.shared_memory). Segments are counted as
  // tandem_weight_sync_bytes_total{direction="sent", transport="shm"}
  // when offered.
  bool shared_memory = false;
  // Offer versions held in device memory to clients that ask (CUDA IPC,
  // see above); the trainer on a CUDA device sets it
  // (weight_sync.cuda_ipc_versions). Must outlive the service.
  const DeviceVersionRing* cuda_ipc = nullptr;
  // Raw data path bounds (see above); the trainer sets them from
  // weight_sync.data_*.
  int max_data_connections = 64;
  int data_stream_threads = 4;
  absl::Duration data_request_timeout = absl::Seconds(10);
  absl::Duration data_send_timeout = absl::Seconds(30);
  // Roles (see above): check callers' certificates. Refusals are counted
  // in `auth_refused` ({reason}: unauthenticated, wrong_role; the daemon's
  // tandem_<daemon>_auth_refused_total) when it is set; it must outlive the
  // service.
  bool tls_enabled = false;
  prometheus::Family<prometheus::Counter>* auth_refused = nullptr;
  // Raw data path authentication (see above). When set, a raw connection
  // must prove the holder's current data-plane key before its request;
  // while the holder has no key every raw connection is refused at once
  // (receivers then use FetchWeights). Unset (tls.mode off): no check.
  std::shared_ptr<const DataPlaneKeyHolder> data_plane_key;
  // Times how long a long poll is held (wait_ms; see above). Must outlive
  // the service. The raw data path's socket timeouts stay real time.
  Clock* clock = RealClock();
};

// Raw data path wire constants (see above).
inline constexpr char kDataPortMetadata[] = "tandem-weight-data-port";
inline constexpr uint32_t kRawMagic = 0x31445754;  // "TWD1"
inline constexpr uint32_t kRawBucketComplete = 1;  // RawChunkHeader.flags
inline constexpr uint32_t kRawEnd = 2;
inline constexpr uint32_t kRawSharedSegment = 4;
// Largest raw chunk; FetchWeightsRequest.chunk_bytes 0 on the raw path asks
// for whole buckets (up to this size).
inline constexpr uint32_t kMaxRawChunkBytes = 1u << 30;
// Largest sealed record's plaintext (see "Raw data path confidentiality").
inline constexpr uint32_t kRawSealedRecordBytes = 1u << 20;
struct RawChunkHeader {
  uint32_t bucket;
  uint32_t flags;
  uint64_t offset;
  uint32_t size;
  uint32_t crc32c;
};
static_assert(sizeof(RawChunkHeader) == 24);

// The longest a long-polled GetManifest is held (GetManifestRequest.wait_ms
// is capped to it).
inline constexpr uint32_t kMaxLongPollMs = 30000;

struct WeightServerStats {
  uint64_t streams = 0;
  uint64_t chunks = 0;
  uint64_t bytes = 0;              // streamed payload bytes (not shm)
  uint64_t shm_offers = 0;         // requests answered with a segment
  uint64_t shm_failures = 0;       // segments that could not be made
  uint64_t cuda_ipc_offers = 0;    // requests answered with device memory
  uint64_t cuda_ipc_leases = 0;    // such calls open now
  uint64_t manifest_requests = 0;  // GetManifest calls, long polls included
  uint64_t long_polls = 0;         // GetManifest calls that were held
  // Raw data path (0 when it is off):
  uint64_t data_connections = 0;       // open now
  uint64_t data_threads = 0;           // event loop + stream pool
  uint64_t data_over_capacity = 0;     // closed at once: every slot busy
  uint64_t data_evicted = 0;           // idle, closed to admit another
  uint64_t data_request_timeouts = 0;  // no whole request in time
  uint64_t data_send_timeouts = 0;     // the receiver stopped reading
  uint64_t data_accept_errors = 0;     // accept() out of fds or memory
  uint64_t data_auth_refused = 0;      // no, stale or wrong proof; no key
};

class WeightServerService final : public v1::WeightServer::CallbackService {
 public:
  // `store` must outlive the service.
  WeightServerService(const WeightStore* store, WeightServerOptions options);
  ~WeightServerService() override;

  // The raw data path's port, 0 when disabled.
  uint16_t data_port() const;

  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* request,
                                        v1::WeightManifest* response) override;

  grpc::ServerWriteReactor<v1::WeightChunk>* FetchWeights(
      grpc::CallbackServerContext* context,
      const v1::FetchWeightsRequest* request) override;

  WeightServerStats stats() const;

  // Long polls held now (not yet answered or cancelled).
  int held_long_polls() const;

  // Answers every held long poll now (as at once) and later ones at once,
  // and ends every call holding a CUDA IPC lease, so that a gRPC server's
  // Shutdown does not wait for them. Idempotent.
  void Shutdown();

  // Fault injection for tests: every later stream fails with UNAVAILABLE
  // after sending `chunks` chunks (negative: never).
  void FailStreamsAfterChunksForTest(int chunks) { fail_after_ = chunks; }
  // The `index`-th chunk sent from now on (counting across streams) has one
  // data byte flipped after its CRC was computed.
  void CorruptChunkForTest(int64_t index) {
    corrupt_at_ = static_cast<int64_t>(chunks_.load()) + index;
  }
  // The `index`-th sealed raw record sent from now on (counting across
  // connections) has one ciphertext byte flipped after it was sealed, as
  // someone on the path between trainer and worker could.
  void CorruptSealedRecordForTest(int64_t index) {
    corrupt_record_at_ = static_cast<int64_t>(sealed_records_.load()) + index;
  }

 private:
  class FetchReactor;
  class LongPoll;
  class RawDataServer;
  struct Stream;

  // Validates a fetch request against the store: the payload and where the
  // stream starts, or the error status to answer with.
  // `raw`: for the raw data path (chunk size not capped by
  // max_chunk_bytes; 0 means whole buckets).
  absl::StatusOr<Stream> OpenStream(const v1::FetchWeightsRequest& request,
                                    bool raw);
  // The next chunk of `stream` (advancing it), with fault injection, stats
  // and metrics applied; nullopt when the stream is complete. `data` is the
  // chunk's bytes inside the payload; `crc` its CRC-32C (as sent).
  struct NextChunk;
  absl::Status InjectedFailure(const Stream& stream) const;
  // Roles (see above): OK, or the refusal (counted and logged) to answer.
  absl::Status Authorize(const grpc::CallbackServerContext& context,
                         const char* rpc) const;
  bool Advance(Stream& stream, NextChunk* chunk);

  // Long polls: the finishing thread's loop, and a held poll's end when the
  // client cancels it.
  void LongPollLoop();
  void CancelLongPoll(LongPoll* poll);

  const WeightStore* store_;
  const WeightServerOptions options_;
  mutable absl::Mutex poll_mu_;
  std::list<LongPoll*> polls_ ABSL_GUARDED_BY(poll_mu_);
  // Something changed (a Put, a new poll, Shutdown): re-check the polls.
  bool poll_dirty_ ABSL_GUARDED_BY(poll_mu_) = false;
  bool polls_shut_down_ ABSL_GUARDED_BY(poll_mu_) = false;
  bool poll_loop_exit_ ABSL_GUARDED_BY(poll_mu_) = false;
  int store_listener_ = -1;
  std::thread poll_thread_;
  std::atomic<uint64_t> manifest_requests_{0};
  std::atomic<uint64_t> long_polls_{0};
  std::unique_ptr<RawDataServer> raw_;
  std::atomic<uint64_t> streams_{0};
  std::atomic<uint64_t> chunks_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> shm_offers_{0};
  std::atomic<uint64_t> shm_failures_{0};
  std::atomic<uint64_t> cuda_ipc_offers_{0};
  // Calls holding a CUDA IPC lease (see above), ended by Shutdown().
  mutable absl::Mutex lease_mu_;
  std::list<FetchReactor*> leases_ ABSL_GUARDED_BY(lease_mu_);
  bool leases_shut_down_ ABSL_GUARDED_BY(lease_mu_) = false;
  std::atomic<int> fail_after_{-1};
  std::atomic<int64_t> corrupt_at_{-1};
  std::atomic<uint64_t> sealed_records_{0};  // sent on the raw path
  std::atomic<int64_t> corrupt_record_at_{-1};
};

}  // namespace tandem::weights
