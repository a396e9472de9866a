// TLS configuration and credentials: the tls.* keys and their checks (each
// error names where the value came from, the key and the value), the
// tandemctl/tandem-local flags, and a real GrpcServer with tls.mode mtls
// that serves only clients with a certificate of its CA, checks the
// server's name, and picks up certificates rotated on disk.

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"
#include "common/config/tls_flags.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/grpc_server.h"
#include "common/rpc/tls_options.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/tandemctl/certs_init.h"
#include "tls_test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

using testing::IssuedCertificates;
using testing::TempDir;

// Every daemon of these tests reloads its certificates every second.
rpc::TlsOptions DaemonTls(const TempDir& dir, const std::string& role) {
  return testing::RoleTls(dir, role, /*refresh_s=*/1);
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// The error of loading `yaml` (file "t.yaml") into a daemon's options and
// running the checks; empty when it loads.
std::string LoadError(const std::string& yaml) {
  config::ServerOptions options;
  config::ConfigSchema schema;
  config::AddServerOptions(&schema, &options);
  absl::Status status = schema.ApplyYamlText(yaml, "t.yaml");
  if (status.ok()) status = schema.Check();
  return std::string(status.message());
}

std::string TlsYaml(const std::string& cert, const std::string& key,
                    const std::string& ca) {
  return "tls:\n  mode: mtls\n  cert: " + cert + "\n  key: " + key +
         "\n  ca: " + ca + "\n";
}

TEST_CASE("tls is off by default and needs no files") {
  config::ServerOptions options;
  config::ConfigSchema schema;
  config::AddServerOptions(&schema, &options);
  CHECK(schema.Check().ok());
  CHECK_FALSE(options.tls.enabled());
  CHECK(rpc::CheckTlsOptions(options.tls).ok());
}

TEST_CASE("mtls without a certificate names the file, line and missing key") {
  CHECK(LoadError("log:\n  level: info\ntls:\n  mode: mtls\n") ==
        "t.yaml:4: tls.mode is mtls but tls.cert is not set (mutual TLS "
        "needs tls.cert, tls.key and tls.ca)");
}

TEST_CASE("a missing certificate file names file, line, key and path") {
  auto dir = IssuedCertificates();
  const std::string error = LoadError(TlsYaml(
      "/nonexistent/c.pem", dir->File("coordinator.key"), dir->File("ca.pem")));
  CHECK(error ==
        "t.yaml:3: tls.cert cannot read '/nonexistent/c.pem': No such file "
        "or directory");
}

TEST_CASE("files without the right PEM are refused") {
  auto dir = IssuedCertificates();
  WriteText(dir->File("junk.pem"), "not a certificate\n");
  CHECK(
      LoadError(TlsYaml(dir->File("coordinator.pem"),
                        dir->File("coordinator.key"), dir->File("junk.pem"))) ==
      "t.yaml:5: tls.ca '" + dir->File("junk.pem") +
          "' holds no PEM certificate");
  // A certificate where the key belongs.
  CHECK(LoadError(TlsYaml(dir->File("coordinator.pem"),
                          dir->File("coordinator.pem"), dir->File("ca.pem"))) ==
        "t.yaml:4: tls.key '" + dir->File("coordinator.pem") +
            "' holds no unencrypted PEM private key");
}

TEST_CASE("a key that belongs to another certificate is refused") {
  auto dir = IssuedCertificates();
  const std::string error =
      LoadError(TlsYaml(dir->File("coordinator.pem"), dir->File("trainer.key"),
                        dir->File("ca.pem")));
  CHECK(error == "t.yaml:4: tls.key the private key in '" +
                     dir->File("trainer.key") +
                     "' does not belong to the certificate in '" +
                     dir->File("coordinator.pem") + "'");
}

TEST_CASE("a valid mtls section loads") {
  auto dir = IssuedCertificates();
  CHECK(LoadError(TlsYaml(dir->File("coordinator.pem"),
                          dir->File("coordinator.key"), dir->File("ca.pem"))) ==
        "");
  CHECK(rpc::CheckTlsOptions(DaemonTls(*dir, "coordinator")).ok());
}

TEST_CASE("TANDEM_TLS_* variables set the keys and are named in errors") {
  config::ServerOptions options;
  config::ConfigSchema schema;
  config::AddServerOptions(&schema, &options);
  std::string mode = "TANDEM_TLS_MODE=mtls";
  std::string cert = "TANDEM_TLS_CERT=/nonexistent/x.pem";
  std::string key = "TANDEM_TLS_KEY=/nonexistent/x.key";
  std::string ca = "TANDEM_TLS_CA=/nonexistent/ca.pem";
  char* env[] = {mode.data(), cert.data(), key.data(), ca.data(), nullptr};
  REQUIRE(schema.ApplyEnvironment(env).ok());
  CHECK(options.tls.mode == "mtls");
  CHECK(std::string(schema.Check().message()) ==
        "environment TANDEM_TLS_CERT: tls.cert cannot read "
        "'/nonexistent/x.pem': No such file or directory");
}

TEST_CASE("client tools' --tls-* flags imply mtls and are checked") {
  auto dir = IssuedCertificates();
  config::TlsFlags flags;
  CLI::App app;
  flags.AddTo(&app);
  const std::string cert = dir->File("admin.pem");
  const std::string key = dir->File("admin.key");
  const std::string ca = dir->File("ca.pem");
  app.parse("--tls-ca " + ca + " --tls-key " + key + " --tls-cert " + cert,
            false);
  absl::StatusOr<rpc::TlsOptions> tls = flags.Resolve();
  REQUIRE(tls.ok());
  CHECK(tls->mode == "mtls");
  CHECK(tls->cert == cert);

  config::TlsFlags bad;
  CLI::App app2;
  bad.AddTo(&app2);
  app2.parse("--tls-cert /nonexistent/a.pem", false);
  CHECK(std::string(bad.Resolve().status().message()) ==
        "--tls-cert/--tls-key/--tls-ca (imply mtls): tls.mode is mtls but "
        "tls.key is not set (mutual TLS needs tls.cert, tls.key and tls.ca)");
}

// grpc.health.v1 Check through `channel`: the status code.
grpc::StatusCode Probe(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  grpc::health::v1::HealthCheckResponse response;
  return stub->Check(&context, {}, &response).error_code();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("an mtls server serves only clients with a certificate of its CA") {
  auto dir = IssuedCertificates();
  auto other = IssuedCertificates();  // another CA
  auto server =
      rpc::GrpcServer::Start("127.0.0.1:0", {}, DaemonTls(*dir, "coordinator"));
  REQUIRE(server.ok());
  const std::string address = (*server)->bound_address();

  CHECK(Probe(rpc::MakeChannel(address, DaemonTls(*dir, "admin"))) ==
        grpc::StatusCode::OK);
  CHECK(Probe(rpc::MakeChannel(address, {})) == grpc::StatusCode::UNAVAILABLE);
  CHECK(Probe(rpc::MakeChannel(address, DaemonTls(*other, "admin"))) ==
        grpc::StatusCode::UNAVAILABLE);
  // TLS with the right CA but no client certificate.
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ReadText(dir->File("ca.pem"));
  CHECK(Probe(grpc::CreateChannel(address, grpc::SslCredentials(no_cert))) ==
        grpc::StatusCode::UNAVAILABLE);
  // A server name the certificate does not carry.
  rpc::TlsOptions renamed = DaemonTls(*dir, "admin");
  renamed.server_name = "not-in-the-certificate.example";
  CHECK(Probe(rpc::MakeChannel(address, renamed)) != grpc::StatusCode::OK);
  // Dialled by a name the certificate carries (localhost), not its IP.
  const std::string port = address.substr(address.rfind(':') + 1);
  CHECK(Probe(rpc::MakeChannel("localhost:" + port, DaemonTls(*dir, "admin"))) ==
        grpc::StatusCode::OK);
}

TEST_CASE("GrpcServer::Start refuses mtls with files that do not load") {
  auto dir = IssuedCertificates();
  rpc::TlsOptions tls = DaemonTls(*dir, "coordinator");
  tls.key = dir->File("trainer.key");
  auto server = rpc::GrpcServer::Start("127.0.0.1:0", {}, tls);
  REQUIRE_FALSE(server.ok());
  CHECK(server.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(server.status().message())
            .find("tls.key: the private "
                  "key in") == 0);
}

TEST_CASE("an mtls server picks up a new CA and certificate from disk") {
  auto served = IssuedCertificates();  // the server's files, rewritten below
  auto next = IssuedCertificates();    // a second CA and its certificates
  const rpc::TlsOptions server_tls = DaemonTls(*served, "coordinator");
  // The first CA's client, in files of its own.
  TempDir first;
  for (const char* f : {"ca.pem", "admin.pem", "admin.key"}) {
    fs::copy_file(served->File(f), first.File(f));
  }
  auto server = rpc::GrpcServer::Start("127.0.0.1:0", {}, server_tls);
  REQUIRE(server.ok());
  const std::string address = (*server)->bound_address();
  REQUIRE(Probe(rpc::MakeChannel(address, DaemonTls(first, "admin"))) ==
          grpc::StatusCode::OK);

  // Rotate the server onto the second CA: key, certificate, then CA file,
  // each replaced by rename.
  for (const char* f : {"coordinator.key", "coordinator.pem", "ca.pem"}) {
    fs::copy_file(next->File(f), served->File(std::string(f) + ".new"));
    fs::rename(served->File(std::string(f) + ".new"), served->File(f));
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  while (absl::Now() < give_up) {
    // A fresh channel each time: a new connection, a new handshake.
    code = Probe(rpc::MakeChannel(address, DaemonTls(*next, "admin")));
    if (code == grpc::StatusCode::OK) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  CHECK(code == grpc::StatusCode::OK);
  CHECK(Probe(rpc::MakeChannel(address, DaemonTls(first, "admin"))) ==
        grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace tandem
