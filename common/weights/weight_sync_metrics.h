#pragma once

// Metric families of weight sync, declared once and registered by the
// daemons that move weights (trainer: sender side; rollout worker: receiver
// side). Labels are bounded: transport is "broadcast", "pull" (a socket:
// the raw data path or FetchWeights) or "shm" (the same-host
// shared-memory pull path; on the sending side, bytes offered in a
// segment), kind is "full" or "delta".
//
//   tandem_weight_sync_bytes_total{direction,transport,kind}   counter
//   tandem_weight_sync_versions_total{direction,transport}     counter
//   tandem_weight_sync_transfer_seconds{direction,transport}   histogram
//   tandem_weight_sync_rejected_versions_total{transport}      counter
//   tandem_weight_sync_aborted_collectives_total               counter
//   tandem_weight_sync_epoch                                   gauge
//   tandem_weight_sync_group_receivers                         gauge
//   tandem_weight_sync_publish_to_staged_seconds{transport}    histogram
//   tandem_weight_sync_publish_to_live_seconds                 histogram
//   tandem_weight_sync_published_payloads_total{kind}          counter
//   tandem_weight_sync_published_bytes_total{kind}             counter
//   tandem_weight_sync_delta_density                           histogram
//   tandem_weight_sync_shm_fallbacks_total{reason}             counter
//   tandem_weight_sync_manifest_requests_total{wait}           counter
//   tandem_weight_sync_nonfinite_versions_total{transport}     counter
//   tandem_weight_sync_digest_mismatches_total{transport}      counter
//   tandem_weight_sync_unsigned_versions_total{transport}      counter
//   tandem_weight_sync_decrypt_failures_total{transport}       counter
//   tandem_weight_sync_data_connections                        gauge
//   tandem_weight_sync_data_connections_dropped_total{reason}  counter
//
// Non-finite versions (worker side): versions received and refused because
// a floating-point tensor held an Inf or a NaN (StagingWeights' finite
// check); they are also counted as rejected.
//
// Digest mismatches (worker side): versions whose staged bytes did not
// hash to the SHA-256 of the trainer's manifest, which arrives over gRPC
// (for a broadcast, fetched by GetManifest, not the in-band copy); also
// counted as rejected, and pulled again over gRPC. Unsigned versions:
// verified without a digest because the trainer sent none (an older one).
//
// Decrypt failures (worker side, tls.mode mtls): sealed weight data
// refused (docs/operations.md, "Sealed weight data"): a broadcast version a
// piece of which failed its AES-256-GCM tag, that was sealed under an epoch
// whose secret this worker does not hold, or that came unsealed; a raw
// pull stream a record of which failed its tag. The version is pulled over
// gRPC instead (FetchWeights, under TLS).
//
// Data connections (trainer side): connections open on the weight
// server's raw data path, and those it closed before serving them, by
// reason: "over_capacity" (refused at once: every slot busy serving or
// queued), "evicted" (an idle connection that had not sent its request,
// closed to admit a new one), "request_timeout" (no complete request in
// time), "send_timeout" (the receiver stopped reading a stream).
//
// shm fallback reasons (worker side: a FULL version asked for in shared
// memory that came over a socket instead): "not_offered" (the server
// offered no segment: its shared memory is off, /dev/shm is full, or the
// version is not kept in one), "open_failed" (the offered segment could
// not be opened here: another host or IPC namespace), "mismatch" (an
// object of that name is here but is not the one offered).
//
// Thread-safe (prometheus-cpp metrics are).

#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem::weights {

enum class SyncTransport { kBroadcast, kPull, kShm, kCudaIpc };
enum class SyncDirection { kSent, kReceived };
enum class ShmFallbackReason { kNotOffered, kOpenFailed, kMismatch };

const char* SyncTransportName(SyncTransport transport);

class WeightSyncMetrics {
 public:
  explicit WeightSyncMetrics(prometheus::Registry& registry);

  // One version moved: `bytes` of payload of the given kind (full = true
  // for a FULL payload) in `seconds`.
  void RecordVersion(SyncDirection direction, SyncTransport transport,
                     bool full, double bytes, double seconds);
  // Payload bytes moved without completing a version (e.g. the chunks a
  // weight server streams; a client may resume or abandon the stream).
  void RecordBytes(SyncDirection direction, SyncTransport transport, bool full,
                   double bytes);
  // Publisher side: a FULL anchor or a DELTA payload of `bytes` published
  // (an anchor may have both).
  void RecordPublishedPayload(bool full, double bytes);
  // Publisher side: the changed fraction of a version's 16-bit words
  // against the version before.
  void RecordDeltaDensity(double density);
  void RecordRejected(SyncTransport transport);
  void RecordAborted();
  // Seconds from the trainer's publish (manifest.published_unix_ms) until
  // the version was staged on this worker, ready for the engine's swap.
  void RecordPublishToStaged(SyncTransport transport, double seconds);
  // Seconds from the trainer's publish until the engine swapped the
  // version in (live) at a step boundary.
  void RecordPublishToLive(double seconds);
  void SetEpoch(uint64_t epoch, int receivers);
  // Worker side: `count` FULL versions that were asked for in shared
  // memory came over a socket, for `reason`.
  void RecordShmFallbacks(ShmFallbackReason reason, double count = 1);
  // Worker side, at start when it asks for shared memory: every reason's
  // series at 0, so the family is scraped (and rates work) before the
  // first fallback.
  void ExposeShmFallbacks();
  // Weight server side: a GetManifest call, held as a long poll (wait
  // "long_poll") or answered at once ("none").
  void RecordManifestRequest(bool held);
  // Weight server side, at start: both waits' series at 0, so the family
  // is scraped before the first pull (which comes only after the first
  // publish names the trainer to the workers).
  void ExposeManifestRequests();
  // Worker side: a version refused for non-finite values.
  void RecordNonFinite(SyncTransport transport);
  // Worker side: a version refused for a SHA-256 mismatch, and one
  // committed without a digest to check (see above).
  void RecordDigestMismatch(SyncTransport transport);
  void RecordUnsigned(SyncTransport transport);
  // Worker side: sealed weight data refused (see above); and, at start
  // under tls.mode mtls, both transports' series at 0.
  void RecordDecryptFailure(SyncTransport transport, double count = 1);
  void ExposeDecryptFailures();
  // Weight server side: raw data connections open now, and one closed
  // unserved for `reason` (see above).
  void SetDataConnections(double open);
  void RecordDataConnectionDropped(const char* reason);
  // Weight server side, at start: every reason's series at 0.
  void ExposeDataConnectionsDropped();

 private:
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& versions_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Counter& aborted_;
  prometheus::Gauge& epoch_;
  prometheus::Gauge& receivers_;
  prometheus::Family<prometheus::Histogram>& publish_to_staged_;
  prometheus::Histogram& publish_to_live_;
  prometheus::Family<prometheus::Counter>& published_payloads_;
  prometheus::Family<prometheus::Counter>& published_bytes_;
  prometheus::Family<prometheus::Histogram>& delta_density_;
  prometheus::Family<prometheus::Counter>& shm_fallbacks_;
  prometheus::Family<prometheus::Counter>& manifest_requests_;
  prometheus::Family<prometheus::Counter>& nonfinite_;
  prometheus::Family<prometheus::Counter>& digest_mismatches_;
  prometheus::Family<prometheus::Counter>& unsigned_;
  prometheus::Family<prometheus::Counter>& decrypt_failures_;
  prometheus::Gauge& data_connections_;
  prometheus::Family<prometheus::Counter>& data_dropped_;
};

}  // namespace tandem::weights
