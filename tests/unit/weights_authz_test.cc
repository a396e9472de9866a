// The weight server's roles under mutual TLS (issue 25 item 3): a real
// mtls GrpcServer serving a WeightServerService, called with certificates
// of each role from one development CA. Trainer, rollout and admin read
// the manifest and the weights; verifier and coordinator certificates are
// refused PERMISSION_DENIED before anything is read, counted by reason.

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/rpc/grpc_client.h"
#include "common/rpc/grpc_server.h"
#include "common/rpc/tls_options.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "services/tandemctl/certs_init.h"
#include "tandem/v1/trainer.grpc.pb.h"
#include "tls_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

// A development CA and role certificates, removed on destruction.
struct CertDir : tandem::testing::TempDir {
  CertDir() : TempDir("weights_authz_test") {
    certs::CertsInitOptions options;
    options.dir = path();
    REQUIRE(certs::WriteDevCertificates(options).ok());
  }
};

rpc::TlsOptions AsRole(const CertDir& certs, const std::string& role) {
  return tandem::testing::RoleTls(certs, role);
}

// A one-version store, served by an mtls (or plaintext) GrpcServer.
struct Served {
  explicit Served(const CertDir& certs, bool tls) : store(4) {
    auto layout = testing::SmallLayout();
    std::mt19937_64 rng(7);
    WeightBuffer weights(layout.total_bytes());
    testing::FillRandom(layout, &weights, rng);
    REQUIRE(testing::PutFullVersion(store, layout, weights, 1).ok());
    refused = &prometheus::BuildCounter()
                   .Name("tandem_test_auth_refused_total")
                   .Help("test")
                   .Register(registry);
    service = std::make_unique<WeightServerService>(
        &store, WeightServerOptions{.data_host = "",
                                    .tls_enabled = tls,
                                    .auth_refused = refused});
    auto started = rpc::GrpcServer::Start(
        "127.0.0.1:0", {service.get()},
        tls ? AsRole(certs, "trainer") : rpc::TlsOptions());
    REQUIRE(started.ok());
    server = *std::move(started);
  }
  ~Served() { service->Shutdown(); }

  double Refused(const char* reason) {
    return refused->Add({{"reason", reason}}).Value();
  }

  WeightStore store;
  prometheus::Registry registry;
  prometheus::Family<prometheus::Counter>* refused = nullptr;
  std::unique_ptr<WeightServerService> service;
  std::unique_ptr<rpc::GrpcServer> server;
};

grpc::StatusCode GetManifestAs(const std::string& address,
                               const rpc::TlsOptions& tls,
                               v1::WeightManifest* manifest) {
  auto stub = v1::WeightServer::NewStub(rpc::MakeChannel(address, tls));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetManifestRequest request;
  return stub->GetManifest(&context, request, manifest).error_code();
}

// The status of a whole FetchWeights stream and the bytes it carried.
grpc::StatusCode FetchAs(const std::string& address, const rpc::TlsOptions& tls,
                         uint64_t* bytes) {
  auto stub = v1::WeightServer::NewStub(rpc::MakeChannel(address, tls));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::FetchWeightsRequest request;
  request.set_policy_version(1);
  auto reader = stub->FetchWeights(&context, request);
  v1::WeightChunk chunk;
  *bytes = 0;
  while (reader->Read(&chunk)) *bytes += chunk.data().size();
  return reader->Finish().error_code();
}

TEST_CASE("trainer, rollout and admin certificates read the weights") {
  CertDir certs;
  Served served(certs, /*tls=*/true);
  const std::string address = served.server->bound_address();
  for (const char* role : {"trainer", "rollout", "admin"}) {
    INFO("role " << role);
    v1::WeightManifest manifest;
    CHECK(GetManifestAs(address, AsRole(certs, role), &manifest) ==
          grpc::StatusCode::OK);
    CHECK(manifest.policy_version() == 1);
    uint64_t bytes = 0;
    CHECK(FetchAs(address, AsRole(certs, role), &bytes) == grpc::StatusCode::OK);
    CHECK(bytes == manifest.total_bytes());
  }
  CHECK(served.Refused("wrong_role") == 0);
  CHECK(served.Refused("unauthenticated") == 0);
}

TEST_CASE("verifier and coordinator certificates are refused, counted") {
  CertDir certs;
  Served served(certs, /*tls=*/true);
  const std::string address = served.server->bound_address();
  for (const char* role : {"verifier", "coordinator"}) {
    INFO("role " << role);
    v1::WeightManifest manifest;
    CHECK(GetManifestAs(address, AsRole(certs, role), &manifest) ==
          grpc::StatusCode::PERMISSION_DENIED);
    CHECK(manifest.policy_version() == 0);
    uint64_t bytes = 0;
    CHECK(FetchAs(address, AsRole(certs, role), &bytes) ==
          grpc::StatusCode::PERMISSION_DENIED);
    CHECK(bytes == 0);
  }
  CHECK(served.Refused("wrong_role") == 4);
  // Nothing was read from the store for them.
  CHECK(served.service->stats().streams == 0);
  CHECK(served.service->stats().manifest_requests == 0);
}

TEST_CASE("a client without a certificate gets nothing") {
  CertDir certs;
  Served served(certs, /*tls=*/true);
  v1::WeightManifest manifest;
  // The TLS handshake itself fails: the server asks for a client
  // certificate of its CA.
  CHECK(GetManifestAs(served.server->bound_address(), rpc::TlsOptions(),
                      &manifest) == grpc::StatusCode::UNAVAILABLE);
  CHECK(served.service->stats().manifest_requests == 0);
}

TEST_CASE("with tls off the weight server checks nothing") {
  CertDir certs;
  Served served(certs, /*tls=*/false);
  v1::WeightManifest manifest;
  CHECK(GetManifestAs(served.server->bound_address(), rpc::TlsOptions(),
                      &manifest) == grpc::StatusCode::OK);
  uint64_t bytes = 0;
  CHECK(FetchAs(served.server->bound_address(), rpc::TlsOptions(), &bytes) ==
        grpc::StatusCode::OK);
  CHECK(bytes == manifest.total_bytes());
}

}  // namespace
}  // namespace tandem::weights
