#pragma once

// GrpcServer runs one daemon's gRPC services (callback API) together with
// the standard grpc.health.v1 health service and server reflection.
//
// Health contract: the overall status ("") and every registered service are
// NOT_SERVING from start until SetServing(true); Shutdown() sets
// NOT_SERVING before it stops accepting calls, so load balancers and probes
// see the daemon leave before connections close.
//
// Shutdown contract: Shutdown(deadline) stops admitting calls, waits up to
// `deadline` for the calls in flight, then closes every connection. It does
// not wait for idle client connections to acknowledge the GOAWAY: an idle
// gRPC client may read it only on its next poll, seconds later, and a
// stopping daemon must not spend its drain deadline on that.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/tls_options.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace tandem::rpc {

class GrpcServer {
 public:
  // Binds `address` (host:port; port 0 picks a free port) and starts
  // serving `services`, which must outlive the server. With tls.mode mtls
  // every connection must present a client certificate that chains to
  // tls.ca (common/rpc/tls_credentials.h), and unreadable or mismatched
  // files are an InvalidArgument error; with TLS off on an address that
  // is not loopback, logs one warning that anyone who can reach the port
  // may call every RPC.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const std::string& address, const std::vector<grpc::Service*>& services,
      const TlsOptions& tls = TlsOptions());
  ~GrpcServer();

  // host:port actually bound.
  const std::string& bound_address() const { return bound_address_; }

  // Flips the health status of the server and all its services.
  void SetServing(bool serving);

  // Health to NOT_SERVING, stops admitting calls, waits up to `deadline`
  // for in-flight calls (returns as soon as none is left), then cancels
  // what remains and closes all connections. Idempotent.
  void Shutdown(absl::Duration deadline);

  // Calls being handled now (received and not yet done). Thread-safe.
  int calls_in_flight() const;

 private:
  class CallCounter;
  class CountingInterceptorFactory;

  GrpcServer() = default;
  std::shared_ptr<CallCounter> calls_;
  std::unique_ptr<grpc::Server> server_;
  std::string bound_address_;
  bool shut_down_ = false;
};

}  // namespace tandem::rpc
