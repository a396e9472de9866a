#include "common/weights/weight_sync_metrics.h"

namespace tandem::weights {
namespace {

const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *buckets;
}

// Changed fraction of 16-bit words between consecutive versions.
const prometheus::Histogram::BucketBoundaries& DensityBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.003, 0.01, 0.03, 0.1, 0.25, 0.5, 1};
  return *buckets;
}

const char* KindName(bool full) { return full ? "full" : "delta"; }

const char* DirectionName(SyncDirection d) {
  return d == SyncDirection::kSent ? "sent" : "received";
}

const char* ShmFallbackReasonName(ShmFallbackReason reason) {
  switch (reason) {
    case ShmFallbackReason::kNotOffered:
      return "not_offered";
    case ShmFallbackReason::kOpenFailed:
      return "open_failed";
    case ShmFallbackReason::kMismatch:
      return "mismatch";
  }
  return "not_offered";
}

}  // namespace

const char* SyncTransportName(SyncTransport transport) {
  switch (transport) {
    case SyncTransport::kBroadcast:
      return "broadcast";
    case SyncTransport::kPull:
      return "pull";
    case SyncTransport::kShm:
      return "shm";
    case SyncTransport::kCudaIpc:
      return "cuda_ipc";
  }
  return "pull";
}

WeightSyncMetrics::WeightSyncMetrics(prometheus::Registry& registry)
    : bytes_(prometheus::BuildCounter()
                 .Name("tandem_weight_sync_bytes_total")
                 .Help("Weight payload bytes moved, by direction, transport "
                       "and payload kind.")
                 .Register(registry)),
      versions_(prometheus::BuildCounter()
                    .Name("tandem_weight_sync_versions_total")
                    .Help("Policy versions moved, by direction and transport.")
                    .Register(registry)),
      seconds_(prometheus::BuildHistogram()
                   .Name("tandem_weight_sync_transfer_seconds")
                   .Help("Time to move one version, by direction and "
                         "transport.")
                   .Register(registry)),
      rejected_(prometheus::BuildCounter()
                    .Name("tandem_weight_sync_rejected_versions_total")
                    .Help("Versions received but rejected (checksum or "
                          "payload errors), by transport.")
                    .Register(registry)),
      aborted_(prometheus::BuildCounter()
                   .Name("tandem_weight_sync_aborted_collectives_total")
                   .Help("Broadcast groups aborted after a failed or "
                         "timed-out collective or rendezvous.")
                   .Register(registry)
                   .Add({})),
      epoch_(prometheus::BuildGauge()
                 .Name("tandem_weight_sync_epoch")
                 .Help("Broadcast membership epoch this daemon takes part in "
                       "(0 = none).")
                 .Register(registry)
                 .Add({})),
      receivers_(prometheus::BuildGauge()
                     .Name("tandem_weight_sync_group_receivers")
                     .Help("Receivers (rollout workers) in that epoch's "
                           "group.")
                     .Register(registry)
                     .Add({})),
      publish_to_staged_(
          prometheus::BuildHistogram()
              .Name("tandem_weight_sync_publish_to_staged_seconds")
              .Help("Seconds from the trainer's publish of a version until "
                    "it is staged on this worker, by transport.")
              .Register(registry)),
      publish_to_live_(
          prometheus::BuildHistogram()
              .Name("tandem_weight_sync_publish_to_live_seconds")
              .Help("Seconds from the trainer's publish of a version until "
                    "the engine swapped it in at a step boundary.")
              .Register(registry)
              .Add({}, SecondsBuckets())),
      published_payloads_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_published_payloads_total")
              .Help("Weight payloads the trainer published: a full one per "
                    "anchor version, a sparse bf16 delta on the version "
                    "before for every other version (and for an anchor "
                    "when the change qualifies).")
              .Register(registry)),
      published_bytes_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_published_bytes_total")
              .Help("Bytes of the published payloads, by kind; divided by "
                    "the payloads, the bytes per version of each kind.")
              .Register(registry)),
      delta_density_(
          prometheus::BuildHistogram()
              .Name("tandem_weight_sync_delta_density")
              .Help("Changed fraction of the 16-bit weight words between "
                    "consecutive published versions (bf16 change "
                    "detection).")
              .Register(registry)),
      shm_fallbacks_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_shm_fallbacks_total")
              .Help("Full versions a worker asked for in shared memory that "
                    "came over a socket instead, by reason: not_offered (no "
                    "segment offered), open_failed (the offered segment "
                    "cannot be opened here: another host or IPC "
                    "namespace), mismatch (a same-named object that is not "
                    "the one offered).")
              .Register(registry)),
      manifest_requests_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_manifest_requests_total")
              .Help("GetManifest calls to the trainer's weight server, by "
                    "wait: long_poll when the call was held until a newer "
                    "version (or its wait_ms), none when answered at once.")
              .Register(registry)),
      nonfinite_(prometheus::BuildCounter()
                     .Name("tandem_weight_sync_nonfinite_versions_total")
                     .Help("Weight versions received and refused because a "
                           "floating-point tensor held an Inf or a NaN (the "
                           "live weights were kept), by transport.")
                     .Register(registry)),
      digest_mismatches_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_digest_mismatches_total")
              .Help("Weight versions received and refused because their "
                    "bytes did not hash to the SHA-256 of the trainer's "
                    "manifest (received over gRPC); the live weights were "
                    "kept and the version pulled again over gRPC, by "
                    "transport.")
              .Register(registry)),
      unsigned_(prometheus::BuildCounter()
                    .Name("tandem_weight_sync_unsigned_versions_total")
                    .Help("Weight versions committed without a SHA-256 to "
                          "check (the trainer's manifest carried none: an "
                          "older trainer), by transport.")
                    .Register(registry)),
      decrypt_failures_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_decrypt_failures_total")
              .Help("Sealed weight data refused (tls.mode mtls): a "
                    "broadcast version with a piece that failed its "
                    "AES-256-GCM tag, sealed under a data-plane epoch this "
                    "worker holds no secret of, or sent unsealed; a raw pull "
                    "stream with a record that failed its tag. The version "
                    "was pulled over gRPC instead, by transport.")
              .Register(registry)),
      data_connections_(prometheus::BuildGauge()
                            .Name("tandem_weight_sync_data_connections")
                            .Help("Connections open on the weight server's "
                                  "raw data path (waiting for a request, "
                                  "queued or streaming).")
                            .Register(registry)
                            .Add({})),
      data_dropped_(
          prometheus::BuildCounter()
              .Name("tandem_weight_sync_data_connections_dropped_total")
              .Help("Raw data path connections the weight server closed "
                    "unserved, by reason: over_capacity (refused at once, "
                    "every slot busy), evicted (idle without a request, "
                    "closed to admit a new connection), request_timeout "
                    "(no complete request in time), send_timeout (the "
                    "receiver stopped reading), unauthenticated (no or a "
                    "wrong data-plane proof), stale_epoch (a proof made "
                    "with another epoch's secret), no_secret (the trainer "
                    "holds no epoch secret yet; tls.mode mtls only).")
              .Register(registry)) {}

void WeightSyncMetrics::ExposeDataConnectionsDropped() {
  for (const char* reason :
       {"over_capacity", "evicted", "request_timeout", "send_timeout",
        "unauthenticated", "stale_epoch", "no_secret"}) {
    data_dropped_.Add({{"reason", reason}});
  }
}

void WeightSyncMetrics::RecordNonFinite(SyncTransport transport) {
  nonfinite_.Add({{"transport", SyncTransportName(transport)}}).Increment();
}

void WeightSyncMetrics::RecordDigestMismatch(SyncTransport transport) {
  digest_mismatches_.Add({{"transport", SyncTransportName(transport)}})
      .Increment();
}

void WeightSyncMetrics::RecordDecryptFailure(SyncTransport transport,
                                             double count) {
  decrypt_failures_.Add({{"transport", SyncTransportName(transport)}})
      .Increment(count);
}

void WeightSyncMetrics::ExposeDecryptFailures() {
  for (SyncTransport t : {SyncTransport::kBroadcast, SyncTransport::kPull}) {
    decrypt_failures_.Add({{"transport", SyncTransportName(t)}});
  }
}

void WeightSyncMetrics::RecordUnsigned(SyncTransport transport) {
  unsigned_.Add({{"transport", SyncTransportName(transport)}}).Increment();
}

void WeightSyncMetrics::SetDataConnections(double open) {
  data_connections_.Set(open);
}

void WeightSyncMetrics::RecordDataConnectionDropped(const char* reason) {
  data_dropped_.Add({{"reason", reason}}).Increment();
}

void WeightSyncMetrics::RecordManifestRequest(bool held) {
  manifest_requests_.Add({{"wait", held ? "long_poll" : "none"}}).Increment();
}

void WeightSyncMetrics::RecordVersion(SyncDirection direction,
                                      SyncTransport transport, bool full,
                                      double bytes, double seconds) {
  const std::string d = DirectionName(direction);
  const std::string t = SyncTransportName(transport);
  bytes_.Add({{"direction", d}, {"transport", t}, {"kind", KindName(full)}})
      .Increment(bytes);
  versions_.Add({{"direction", d}, {"transport", t}}).Increment();
  seconds_.Add({{"direction", d}, {"transport", t}}, SecondsBuckets())
      .Observe(seconds);
}

void WeightSyncMetrics::RecordBytes(SyncDirection direction,
                                    SyncTransport transport, bool full,
                                    double bytes) {
  bytes_
      .Add({{"direction", DirectionName(direction)},
            {"transport", SyncTransportName(transport)},
            {"kind", KindName(full)}})
      .Increment(bytes);
}

void WeightSyncMetrics::RecordPublishedPayload(bool full, double bytes) {
  published_payloads_.Add({{"kind", KindName(full)}}).Increment();
  published_bytes_.Add({{"kind", KindName(full)}}).Increment(bytes);
}

void WeightSyncMetrics::RecordDeltaDensity(double density) {
  delta_density_.Add({}, DensityBuckets()).Observe(density);
}

void WeightSyncMetrics::RecordRejected(SyncTransport transport) {
  rejected_.Add({{"transport", SyncTransportName(transport)}}).Increment();
}

void WeightSyncMetrics::RecordAborted() { aborted_.Increment(); }

void WeightSyncMetrics::RecordPublishToStaged(SyncTransport transport,
                                              double seconds) {
  publish_to_staged_
      .Add({{"transport", SyncTransportName(transport)}}, SecondsBuckets())
      .Observe(seconds);
}

void WeightSyncMetrics::RecordPublishToLive(double seconds) {
  publish_to_live_.Observe(seconds);
}

void WeightSyncMetrics::SetEpoch(uint64_t epoch, int receivers) {
  epoch_.Set(static_cast<double>(epoch));
  receivers_.Set(receivers);
}

void WeightSyncMetrics::RecordShmFallbacks(ShmFallbackReason reason,
                                           double count) {
  shm_fallbacks_.Add({{"reason", ShmFallbackReasonName(reason)}})
      .Increment(count);
}

void WeightSyncMetrics::ExposeManifestRequests() {
  for (const char* wait : {"long_poll", "none"}) {
    manifest_requests_.Add({{"wait", wait}});
  }
}

void WeightSyncMetrics::ExposeShmFallbacks() {
  for (ShmFallbackReason reason :
       {ShmFallbackReason::kNotOffered, ShmFallbackReason::kOpenFailed,
        ShmFallbackReason::kMismatch}) {
    shm_fallbacks_.Add({{"reason", ShmFallbackReasonName(reason)}});
  }
}

}  // namespace tandem::weights
