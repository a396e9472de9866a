#include "common/metrics/metrics_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"

namespace tandem::metrics {
namespace {

constexpr char kVersion[] = "0.1.0";

// Opens and at once closes a TCP connection to host:port. A wildcard host
// is reached through loopback.
void Knock(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return;
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

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

MetricsServer::~MetricsServer() {
  if (exposer_ == nullptr) return;
  // The exposer's HTTP server (civetweb) notices a stop only when its
  // listener's poll() returns, which without traffic takes up to its 2 s
  // poll timeout. Knocking on the port wakes it, so destruction takes
  // milliseconds; knock until it is done, since a knock that lands before
  // the stop flag is set is just served as a closed connection.
  std::atomic<bool> stopped{false};
  std::thread stop([this, &stopped] {
    exposer_.reset();
    stopped = true;
  });
  while (!stopped) {
    Knock(bound_address_);
    absl::SleepFor(absl::Milliseconds(20));
  }
  stop.join();
}

}  // namespace tandem::metrics
