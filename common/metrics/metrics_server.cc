#include "common/metrics/metrics_server.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"

namespace tandem::metrics {
namespace {

constexpr char kVersion[] = "0.1.0";

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Create(
    const std::string& address, const std::string& daemon,
    std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  prometheus::BuildGauge()
      .Name("tandem_build_info")
      .Help("Always 1; labels carry the daemon and its version.")
      .Register(*server->registry_)
      .Add({{"daemon", daemon}, {"version", kVersion}})
      .Set(1);
  const double start_seconds =
      std::chrono::duration<double>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  prometheus::BuildGauge()
      .Name("tandem_process_start_time_seconds")
      .Help("Unix time when the daemon started, in seconds.")
      .Register(*server->registry_)
      .Add({})
      .Set(start_seconds);
  if (address.empty()) return server;

  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address must be host:port, got '", address, "'"));
  }
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  server->exposer_->RegisterCollectable(server->registry_);
  auto ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint on ", address, " has no port"));
  }
  server->bound_address_ =
      absl::StrCat(address.substr(0, colon), ":", ports.front());
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace tandem::metrics
