// tandemctl: command-line client for a running Tandem cluster.
//
//   tandemctl status [--coordinator HOST:PORT] [--json]

#include <google/protobuf/util/json_util.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "common/rpc/grpc_client.h"
#include "services/tandemctl/cluster_status.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace {

std::string DefaultCoordinator() {
  const char* env = std::getenv("TANDEM_COORDINATOR_ADDRESS");
  return env != nullptr ? env : "127.0.0.1:50051";
}

int RunStatus(const std::string& coordinator, bool json, double timeout_s) {
  auto stub =
      tandem::v1::Coordinator::NewStub(tandem::rpc::MakeChannel(coordinator));
  tandem::v1::GetClusterStatusResponse response;
  tandem::rpc::RetryPolicy policy;
  policy.attempt_timeout = absl::Seconds(timeout_s);
  policy.total_timeout = absl::Seconds(timeout_s);
  absl::Status status = tandem::rpc::CallWithRetry(
      "GetClusterStatus", policy, [&](grpc::ClientContext* context) {
        return stub->GetClusterStatus(
            context, tandem::v1::GetClusterStatusRequest(), &response);
      });
  if (!status.ok()) {
    std::cerr << "tandemctl: cannot reach coordinator at " << coordinator
              << ": " << status.message() << "\n";
    return 1;
  }
  if (json) {
    std::string text;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    (void)google::protobuf::util::MessageToJsonString(response, &text, options);
    std::cout << text;
  } else {
    std::cout << tandem::ctl::FormatClusterStatus(
        response, absl::ToUnixMillis(absl::Now()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandemctl: inspect and steer a Tandem cluster"};
  app.require_subcommand(1);
  std::string coordinator = DefaultCoordinator();
  bool json = false;
  double timeout_s = 5;
  CLI::App* status = app.add_subcommand(
      "status", "Members, their versions and health, queue depths");
  status->add_option("--coordinator", coordinator,
                     "Coordinator host:port (env TANDEM_COORDINATOR_ADDRESS)");
  status->add_flag("--json", json, "Print the raw status as JSON");
  status->add_option("--timeout", timeout_s, "Seconds to wait for an answer");
  CLI11_PARSE(app, argc, argv);
  if (status->parsed()) return RunStatus(coordinator, json, timeout_s);
  return 2;
}
