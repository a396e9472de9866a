#pragma once

// A Prometheus registry and its HTTP /metrics endpoint, one per daemon. The
// registry is passed to every component that defines metric families (no
// global registry), and exposed as text format 0.0.4 on `address`.
//
// The endpoint is a small Boost.Beast server on one thread of its own (a
// std::thread with the default stack), not prometheus-cpp's civetweb
// Exposer: civetweb's worker threads have fixed 100 KiB stacks, which the
// static TLS of the CUDA libraries LibTorch loads (cuBLAS, NCCL, ...; about
// 190 KiB in all) does not fit in, so the exposer could not start in the
// trainer or the rollout worker.
//
// Idle or slow clients never hold up a scrape: every read and write is
// asynchronous with a deadline (60 s for a request, 30 s for a response),
// at most 64 connections are open (a new one past that closes the oldest
// connection still waiting for a request), and accept() failures such as
// EMFILE close the oldest waiting connection and try again, or, with none
// to close, pause accepting with a back-off (10 ms doubling to 1 s)
// instead of spinning. Connections closed
// so are counted in tandem_metrics_connections_dropped_total{reason}.
//
// With MetricsTls mode "tls" the endpoint is HTTPS (TLS 1.2 or newer) with
// the daemon's certificate; with "mtls" a scraper must also present a
// certificate that chains to the CA (any role: Prometheus is given one, see
// docs/operations.md). The files are read again when they change on disk,
// checked at most every refresh_s on a new connection: rotated files serve
// new connections without a restart (open ones keep theirs). A rotation
// that does not load (a half-written file) keeps the last good files and
// is counted in tandem_metrics_tls_reload_failures_total. The handshake
// has the request's deadline and counts as waiting for a request (an idle
// handshake is evicted first).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

struct MetricsTls {
  // "off" (plain HTTP), "tls" (HTTPS) or "mtls" (HTTPS, and the client's
  // certificate must chain to `ca`).
  std::string mode = "off";
  std::string cert;  // PEM chain presented
  std::string key;   // its private key
  std::string ca;    // mtls: the CA bundle scrapers' certificates chain to
  int64_t refresh_s = 60;
  bool enabled() const { return mode != "off"; }
};

class MetricsServer {
 public:
  // Starts serving `registry` on host:port (port 0 picks a free port). An
  // empty address creates no HTTP endpoint. Also registers
  // tandem_build_info and tandem_process_start_time_seconds for `daemon`.
  // InvalidArgument naming metrics.tls / tls.* when `tls` is enabled and
  // its files do not load.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Create(
      const std::string& address, const std::string& daemon,
      std::shared_ptr<prometheus::Registry> registry,
      const MetricsTls& tls = {});
  ~MetricsServer();

  // host:port actually bound ("" when disabled).
  const std::string& bound_address() const { return bound_address_; }
  prometheus::Registry& registry() { return *registry_; }

 private:
  class Http;

  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  // Serves GET /metrics until destroyed; null when disabled.
  std::unique_ptr<Http> http_;
  std::string bound_address_;
};

}  // namespace tandem::metrics
