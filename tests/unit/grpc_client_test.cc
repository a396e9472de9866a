// CallWithRetry against a real coordinator on loopback: retries UNAVAILABLE
// until the server appears, gives up on non-retryable codes at once, and
// respects its total budget when nothing ever answers.

#include "common/rpc/grpc_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "services/coordinator/coordinator.h"

namespace tandem {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

coordinator::CoordinatorConfig ConfigOn(const std::string& address) {
  coordinator::CoordinatorConfig config;
  config.server.grpc_address = address;
  config.server.metrics_address = "";
  return config;
}

TEST_CASE("CallWithRetry retries UNAVAILABLE until the server comes up") {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  std::unique_ptr<coordinator::Coordinator> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(400));
    auto created = coordinator::Coordinator::Create(ConfigOn(address));
    REQUIRE(created.ok());
    server = std::move(created).value();
    REQUIRE(server->Start().ok());
  });
  auto stub = tandem::v1::Coordinator::NewStub(rpc::MakeChannel(address, {}));
  int attempts = 0;
  rpc::RetryPolicy policy;
  policy.attempt_timeout = absl::Milliseconds(200);
  policy.total_timeout = absl::Seconds(10);
  tandem::v1::GetClusterStatusResponse response;
  absl::Status status =
      rpc::CallWithRetry("GetClusterStatus", policy, [&](auto* context) {
        ++attempts;
        return stub->GetClusterStatus(
            context, tandem::v1::GetClusterStatusRequest(), &response);
      });
  starter.join();
  CHECK(status.ok());
  CHECK(attempts > 1);
  CHECK(response.group_size() == 8);
  server->GracefulStop(absl::Seconds(1));
}

TEST_CASE("CallWithRetry returns a non-retryable error after one attempt") {
  auto created = coordinator::Coordinator::Create(ConfigOn("127.0.0.1:0"));
  REQUIRE(created.ok());
  auto server = std::move(created).value();
  REQUIRE(server->Start().ok());
  auto stub = tandem::v1::Coordinator::NewStub(
      rpc::MakeChannel(server->grpc_address(), {}));
  int attempts = 0;
  tandem::v1::RegisterResponse response;
  absl::Status status = rpc::CallWithRetry(
      "Register", rpc::RetryPolicy(), [&](grpc::ClientContext* context) {
        ++attempts;
        // Role left unspecified: INVALID_ARGUMENT.
        return stub->Register(context, tandem::v1::RegisterRequest(),
                              &response);
      });
  CHECK(attempts == 1);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("Register failed after 1 attempt(s)"));
  CHECK_THAT(std::string(status.message()), Catch::Contains("role"));
  server->GracefulStop(absl::Seconds(1));
}

TEST_CASE("CallWithRetry gives up within its total budget") {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  auto stub = tandem::v1::Coordinator::NewStub(rpc::MakeChannel(address, {}));
  rpc::RetryPolicy policy;
  policy.attempt_timeout = absl::Milliseconds(100);
  policy.total_timeout = absl::Milliseconds(600);
  const absl::Time start = absl::Now();
  tandem::v1::GetClusterStatusResponse response;
  absl::Status status =
      rpc::CallWithRetry("GetClusterStatus", policy, [&](auto* context) {
        return stub->GetClusterStatus(
            context, tandem::v1::GetClusterStatusRequest(), &response);
      });
  const absl::Duration elapsed = absl::Now() - start;
  CHECK_FALSE(status.ok());
  CHECK((status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded));
  CHECK(elapsed < absl::Seconds(3));
}

}  // namespace
}  // namespace tandem
