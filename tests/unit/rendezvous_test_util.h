#pragma once

// The trainer's side of the broadcast rendezvous store for tests: its
// RendezvousKeys, the RendezvousService over them, and a real mTLS
// GrpcServer with the trainer's certificate; clients with any role's
// certificate. Used by weights_rendezvous_test and
// weights_gloo_grpc_rendezvous_test.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "common/rpc/grpc_client.h"
#include "common/rpc/grpc_server.h"
#include "common/weights/broadcast/rendezvous_client.h"
#include "common/weights/broadcast/rendezvous_keys.h"
#include "services/trainer/rendezvous_service.h"
#include "tls_test_util.h"

namespace tandem::testing {

struct RendezvousTestServer {
  explicit RendezvousTestServer(const TempDir& certs,
                                weights::RendezvousLimits limits = {})
      : keys(std::make_shared<weights::RendezvousKeys>(limits)) {
    refused = &prometheus::BuildCounter()
                   .Name("tandem_test_auth_refused_total")
                   .Help("test")
                   .Register(registry);
    service = std::make_unique<trainer::RendezvousService>(keys, true, refused);
    auto started = rpc::GrpcServer::Start("127.0.0.1:0", {service.get()},
                                          RoleTls(certs, "trainer"));
    if (!started.ok()) {
      throw std::runtime_error(std::string(started.status().message()));
    }
    server = *std::move(started);
  }
  ~RendezvousTestServer() {
    service->Shutdown();
    server.reset();
  }

  // A member's client with `tls` (its role's certificate).
  std::unique_ptr<weights::RendezvousClient> Client(
      const rpc::TlsOptions& tls) {
    const std::string address = server->bound_address();
    return std::make_unique<weights::RendezvousClient>(
        rpc::MakeChannel(address, tls), address, absl::Seconds(5));
  }
  // Calls the service refused, by reason (unauthenticated, wrong_role).
  double Refused(const char* reason) {
    return refused->Add({{"reason", reason}}).Value();
  }

  std::shared_ptr<weights::RendezvousKeys> keys;
  prometheus::Registry registry;
  prometheus::Family<prometheus::Counter>* refused = nullptr;
  std::unique_ptr<trainer::RendezvousService> service;
  std::unique_ptr<rpc::GrpcServer> server;
};

}  // namespace tandem::testing
