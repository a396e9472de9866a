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

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

class MetricsServer {
 public:
  // Starts serving `registry` on host:port (port 0 picks a free port). An
  // empty address creates no HTTP endpoint. Also registers
  // tandem_build_info and tandem_process_start_time_seconds for `daemon`.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Create(
      const std::string& address, const std::string& daemon,
      std::shared_ptr<prometheus::Registry> registry);
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
