// CallWithRetry against a real coordinator on loopback: retries UNAVAILABLE
// until the server appears, gives up on non-retryable codes at once, and
// respects its total budget when nothing ever answers. On a fake clock
// (tests/support/fake_clock.h's SteppingClock): the backoff schedule, the
// budget, and the attempts' real-time gRPC deadlines.

#include "common/rpc/grpc_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/coordinator/coordinator.h"
#include "tests/support/fake_clock.h"

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

// A call that fails with `code` and records when (on `clock`) it ran.
std::function<grpc::Status(grpc::ClientContext*)> FailingCall(
    grpc::StatusCode code, const Clock& clock, std::vector<absl::Time>* at) {
  return [code, &clock, at](grpc::ClientContext*) {
    at->push_back(clock.Now());
    return grpc::Status(code, "scripted failure");
  };
}

TEST_CASE(
    "CallWithRetry pauses on its clock, doubling from initial_backoff to "
    "max_backoff with jitter, until the next pause would pass the budget") {
  testing::SteppingClock clock;
  const absl::Time start = clock.Now();
  rpc::RetryPolicy policy;
  policy.clock = &clock;
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = absl::Seconds(2);
  policy.total_timeout = absl::Seconds(30);
  std::vector<absl::Time> attempts;
  absl::Status status = rpc::CallWithRetry(
      "Lease", policy,
      FailingCall(grpc::StatusCode::UNAVAILABLE, clock, &attempts));
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(absl::StrCat("Lease failed after ",
                                          attempts.size(), " attempt(s)")));

  // One pause before every attempt but the first, each in [b/2, b] of its
  // step b of the doubling schedule, and nothing else moved the clock.
  const std::vector<absl::Duration> sleeps = clock.sleeps();
  REQUIRE(sleeps.size() + 1 == attempts.size());
  CHECK(attempts.front() == start);
  absl::Duration b = policy.initial_backoff;
  for (size_t k = 0; k < sleeps.size(); ++k) {
    INFO("pause " << k << ": " << absl::FormatDuration(sleeps[k]) << ", step "
                  << absl::FormatDuration(b));
    CHECK(sleeps[k] >= b / 2);
    CHECK(sleeps[k] <= b);
    CHECK(attempts[k + 1] - attempts[k] == sleeps[k]);
    b = std::min(b * 2, policy.max_backoff);
  }
  // 50 ms .. 1.6 s, then 2 s pauses: at least 30 s / 2 s of them fit.
  CHECK(sleeps.size() >= 15);
  CHECK(sleeps.back() <= policy.max_backoff);
  // It stopped because the next pause (step b) would end at or past the
  // budget's end, not before.
  CHECK(attempts.back() < start + policy.total_timeout);
  CHECK(attempts.back() + b >= start + policy.total_timeout);
}

TEST_CASE("CallWithRetry's budget counts the time its attempts take") {
  testing::SteppingClock clock;
  const absl::Time start = clock.Now();
  rpc::RetryPolicy policy;
  policy.clock = &clock;
  policy.attempt_timeout = absl::Seconds(5);
  policy.total_timeout = absl::Seconds(12);
  int attempts = 0;
  // Every attempt runs into its 5 s deadline on the clock.
  absl::Status status =
      rpc::CallWithRetry("Pull", policy, [&](grpc::ClientContext*) {
        ++attempts;
        clock.Advance(policy.attempt_timeout);
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow");
      });
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  // 0-5 s, 5-10 s (each plus a pause under 0.1 s), then the third attempt
  // gets the < 2 s left as its deadline: a DEADLINE_EXCEEDED then is the
  // budget's end and is not retried.
  CHECK(attempts == 3);
  CHECK(clock.Now() - start >= absl::Seconds(15));
  CHECK(clock.sleeps().size() == 2);
}

TEST_CASE(
    "CallWithRetry sets each attempt's gRPC deadline in real time, not on "
    "its clock") {
  // The fake clock reads 2033; a deadline taken from it would let a real
  // call hang for years.
  testing::SteppingClock clock;
  rpc::RetryPolicy policy;
  policy.clock = &clock;
  policy.attempt_timeout = absl::Seconds(5);
  policy.total_timeout = absl::Seconds(7);
  std::vector<absl::Time> deadlines;
  std::vector<absl::Time> real_starts;
  const absl::Time before = absl::Now();
  absl::Status status =
      rpc::CallWithRetry("Status", policy, [&](grpc::ClientContext* context) {
        real_starts.push_back(absl::Now());
        deadlines.push_back(absl::FromChrono(context->deadline()));
        clock.Advance(absl::Seconds(4));
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
      });
  CHECK_FALSE(status.ok());
  REQUIRE(deadlines.size() == 2);
  // Each deadline was set, in real time, between `before` and the
  // attempt's start: the first attempt_timeout away, the second only the
  // budget left on the clock (7 s - 4 s - the pause between them). (1 us
  // of slack: chrono time points round to whole nanoseconds.)
  const absl::Duration slack = absl::Microseconds(1);
  CHECK(deadlines[0] >= before + policy.attempt_timeout - slack);
  CHECK(deadlines[0] <= real_starts[0] + policy.attempt_timeout + slack);
  REQUIRE(clock.sleeps().size() == 1);
  const absl::Duration left = absl::Seconds(3) - clock.sleeps()[0];
  CHECK(deadlines[1] >= before + left - slack);
  CHECK(deadlines[1] <= real_starts[1] + left + slack);
}

}  // namespace
}  // namespace tandem
