#pragma once

// A Prometheus registry and its HTTP /metrics exposer, one per daemon. The
// registry is passed to every component that defines metric families (no
// global registry), and exposed as text format 0.0.4 on `address`.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

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
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bound_address_;
};

}  // namespace tandem::metrics
