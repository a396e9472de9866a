// tandemctl: command-line client for a running Tandem cluster.
//
//   tandemctl status [--coordinator HOST:PORT] [--json]
//   tandemctl watch [--coordinator HOST:PORT] [--member-id ID]
//   tandemctl health --address HOST:PORT [--service NAME]
//   tandemctl worker (status|pause|resume|drain) --address HOST:PORT [--json]
//   tandemctl certs init --dir D [--days N] [--hosts h1,h2]
//   (the commands that dial take --tls-cert/--tls-key/--tls-ca/--tls-mode/
//   --tls-server-name, or TANDEM_TLS_*: docs/operations.md, TLS)
//   tandemctl (tokenize|logprobs|generate|export) ...
//       model tools: run by the tandem-model binary next to tandemctl with
//       the same arguments (tandemctl itself links no LibTorch)

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "common/base/executable_dir.h"
#include "common/cluster/cluster_status.h"
#include "common/cluster/coordinator_client.h"
#include "common/config/tls_flags.h"
#include "common/rpc/grpc_client.h"
#include "services/tandemctl/certs_init.h"
#include "services/tandemctl/remote_calls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/rollout.grpc.pb.h"

namespace {

std::string DefaultCoordinator() {
  const char* env = std::getenv("TANDEM_COORDINATOR_ADDRESS");
  return env != nullptr ? env : "127.0.0.1:50051";
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &text, options);
  return text;
}

int Fail(const std::string& what, const std::string& address,
         const absl::Status& status) {
  std::cerr << "tandemctl: " << what << " at " << address << ": "
            << status.message() << "\n";
  return 1;
}

int RunStatus(const std::string& coordinator, bool json, double timeout_s,
              const tandem::rpc::TlsOptions& tls) {
  tandem::v1::GetClusterStatusResponse response;
  absl::Status status = tandem::ctl::GetClusterStatus(
      coordinator, tls,
      tandem::ctl::CommandRetryPolicy(absl::Seconds(timeout_s)), &response);
  if (!status.ok())
    return Fail("cannot reach coordinator", coordinator, status);
  std::cout << (json ? ToJson(response)
                     : tandem::cluster::FormatClusterStatus(
                           response, absl::ToUnixMillis(absl::Now())));
  return 0;
}

// Prints every ClusterEvent as one JSON line (snapshot first) until the
// stream ends: exit 0 when the coordinator ends it (after ShutdownEvent on
// a graceful stop), 1 on an error. Interrupt to stop watching.
int RunWatch(const std::string& coordinator, const std::string& member_id,
             const tandem::rpc::TlsOptions& tls) {
  auto client = tandem::cluster::ConnectCoordinator(coordinator, tls);
  grpc::ClientContext context;
  tandem::v1::WatchClusterRequest request;
  request.set_member_id(member_id);
  auto reader = client->WatchCluster(&context, request);
  tandem::v1::ClusterEvent event;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  while (reader->Read(&event)) {
    std::string line;
    (void)google::protobuf::util::MessageToJsonString(event, &line, options);
    std::cout << line << std::endl;  // flushed: a pipe sees each event
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    return Fail("WatchCluster failed", coordinator,
                tandem::rpc::ToAbslStatus(status));
  }
  return 0;
}

// Exit code 0 when SERVING, 1 otherwise: usable as a container healthcheck.
int RunHealth(const std::string& address, const std::string& service,
              double timeout_s, const tandem::rpc::TlsOptions& tls) {
  auto stub = grpc::health::v1::Health::NewStub(
      tandem::rpc::MakeChannel(address, tls));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s)));
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::cout << "UNREACHABLE " << status.error_message() << "\n";
    return 1;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                   response.status())
            << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? 0
             : 1;
}

int RunWorker(const std::string& action, const std::string& address, bool json,
              double timeout_s, const tandem::rpc::TlsOptions& tls) {
  tandem::v1::RolloutStatus response;
  absl::Status status = tandem::ctl::CallWorker(
      action, address, tls,
      tandem::ctl::CommandRetryPolicy(absl::Seconds(timeout_s)), &response);
  if (!status.ok())
    return Fail("worker " + action + " failed", address, status);
  if (json) {
    std::cout << ToJson(response);
  } else {
    std::cout << tandem::v1::RolloutState_Name(response.state()) << " version "
              << response.policy_version() << " running "
              << response.running_sequences() << " waiting "
              << response.waiting_sequences() << " prefetched "
              << response.prefetched_prompts() << " tokens "
              << response.generated_tokens_total() << "\n";
  }
  return 0;
}

// The model tools live in tandem-model, which links LibTorch: `tandemctl
// <tool> ARGS` replaces this process with `tandem-model <tool> ARGS` from
// tandemctl's own directory. Returns only on failure (exit code 2).
bool IsModelTool(const char* name) {
  for (const char* tool : {"tokenize", "logprobs", "generate", "export"}) {
    if (std::strcmp(name, tool) == 0) return true;
  }
  return false;
}

int RunModelTool(int argc, char** argv) {
  const std::string tool = tandem::ExecutableDir() + "/tandem-model";
  std::vector<char*> args;
  args.push_back(const_cast<char*>(tool.c_str()));
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(tool.c_str(), args.data());
  std::cerr << "tandemctl: " << argv[1] << " is a model tool of "
            << "tandem-model, which cannot be run from " << tool << ": "
            << std::strerror(errno) << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && IsModelTool(argv[1])) return RunModelTool(argc, argv);
  CLI::App app{"tandemctl: inspect and steer a Tandem cluster"};
  app.require_subcommand(1);
  std::string coordinator = DefaultCoordinator();
  std::string address, service, action;
  bool json = false;
  double timeout_s = 5;

  CLI::App* status = app.add_subcommand(
      "status", "Members, their versions and health, queue depths");
  status->add_option("--coordinator", coordinator,
                     "Coordinator host:port (env TANDEM_COORDINATOR_ADDRESS)");
  status->add_flag("--json", json, "Print the raw status as JSON");
  status->add_option("--timeout", timeout_s, "Seconds to wait for an answer");

  std::string member_id;
  CLI::App* watch = app.add_subcommand(
      "watch",
      "Cluster events (policy versions, broadcast epochs, shutdown) as JSON "
      "lines until interrupted");
  watch->add_option("--coordinator", coordinator,
                    "Coordinator host:port (env TANDEM_COORDINATOR_ADDRESS)");
  watch->add_option("--member-id", member_id,
                    "Watch as this member (default: an observer)");

  CLI::App* health = app.add_subcommand(
      "health", "grpc.health.v1 check of any daemon; exit 0 iff SERVING");
  health->add_option("--address", address, "Daemon gRPC host:port")->required();
  health->add_option("--service", service, "Service name (default: overall)");
  health->add_option("--timeout", timeout_s, "Seconds to wait for an answer");

  CLI::App* worker = app.add_subcommand(
      "worker", "Status, pause, resume or drain a rollout worker");
  worker->add_option("action", action, "status | pause | resume | drain")
      ->required()
      ->check(CLI::IsMember({"status", "pause", "resume", "drain"}));
  worker->add_option("--address", address, "Rollout worker gRPC host:port")
      ->required();
  worker->add_flag("--json", json, "Print the raw status as JSON");
  worker->add_option("--timeout", timeout_s, "Seconds to wait for an answer");

  tandem::config::TlsFlags tls_flags;
  for (CLI::App* dialer : {status, watch, health, worker}) {
    tls_flags.AddTo(dialer);
  }

  tandem::certs::CertsInitOptions certs_options;
  CLI::App* certs = app.add_subcommand(
      "certs", "Development certificates for mutual TLS");
  certs->require_subcommand(1);
  CLI::App* certs_init = certs->add_subcommand(
      "init",
      "Write a development CA and a key and certificate per role "
      "(coordinator, trainer, rollout, verifier, admin) into --dir");
  tandem::certs::AddCertsInitFlags(certs_init, &certs_options);

  app.footer(
      "Model tools: tandemctl tokenize|logprobs|generate|export ... runs "
      "tandem-model (next to tandemctl) with the same arguments; see "
      "tandem-model --help.");

  CLI11_PARSE(app, argc, argv);
  if (certs_init->parsed()) return tandem::certs::RunCertsInit(certs_options);
  absl::StatusOr<tandem::rpc::TlsOptions> tls = tls_flags.Resolve();
  if (!tls.ok()) {
    std::cerr << "tandemctl: " << tls.status().message() << "\n";
    return 2;
  }
  if (status->parsed()) return RunStatus(coordinator, json, timeout_s, *tls);
  if (watch->parsed()) return RunWatch(coordinator, member_id, *tls);
  if (health->parsed()) return RunHealth(address, service, timeout_s, *tls);
  if (worker->parsed()) {
    return RunWorker(action, address, json, timeout_s, *tls);
  }
  return 2;
}
