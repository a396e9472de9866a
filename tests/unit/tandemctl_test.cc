// tandemctl's calls to a daemon (services/tandemctl/remote_calls.h) on a
// fake clock (tests/support/fake_clock.h's SteppingClock): an unreachable
// coordinator or worker is asked again after doubling pauses until
// --timeout has passed on the clock, never past it; --timeout is also the
// one attempt's real-time gRPC deadline, and an attempt that runs into it
// is not repeated.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/tandemctl/remote_calls.h"
#include "tests/support/fake_clock.h"

namespace tandem::ctl {
namespace {

// host:port on loopback where nothing listens (a port the kernel handed
// out and that was closed again): every call is refused, UNAVAILABLE.
std::string RefusingAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

// The pauses `sleeps` that CallWithRetry made between the attempts of one
// command with budget `timeout` (on a SteppingClock, where only the pauses
// move time): pause k is in [b/2, b] of the doubling step b (50 ms, 100 ms,
// ... 2 s), and the attempts stopped because the next step would have
// ended at or past the budget, not before.
void CheckRetrySchedule(const std::vector<absl::Duration>& sleeps,
                        absl::Duration timeout) {
  absl::Duration b = absl::Milliseconds(50);
  absl::Duration elapsed = absl::ZeroDuration();
  for (size_t k = 0; k < sleeps.size(); ++k) {
    INFO("pause " << k << ": " << absl::FormatDuration(sleeps[k]) << ", step "
                  << absl::FormatDuration(b));
    CHECK(sleeps[k] >= b / 2);
    CHECK(sleeps[k] <= b);
    elapsed += sleeps[k];
    b = std::min(b * 2, absl::Seconds(2));
  }
  INFO(sleeps.size() << " pauses, " << absl::FormatDuration(elapsed)
                     << " on the clock, next step " << absl::FormatDuration(b));
  CHECK(elapsed < timeout);
  CHECK(elapsed + b >= timeout);
}

TEST_CASE(
    "tandemctl status asks an unreachable coordinator again after doubling "
    "pauses on its clock until --timeout has passed, not longer") {
  testing::SteppingClock clock;
  const absl::Duration timeout = absl::Seconds(5);
  tandem::v1::GetClusterStatusResponse response;
  const absl::Status status = GetClusterStatus(
      RefusingAddress(), {}, CommandRetryPolicy(timeout, &clock), &response);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  const std::vector<absl::Duration> sleeps = clock.sleeps();
  // 50 ms .. 1.6 s and then 2 s steps: at least 6 pauses fit in 5 s.
  CHECK(sleeps.size() >= 6);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(absl::StrCat("GetClusterStatus failed after ",
                                          sleeps.size() + 1, " attempt(s)")));
  CheckRetrySchedule(sleeps, timeout);
}

TEST_CASE(
    "tandemctl worker drain asks an unreachable worker again after doubling "
    "pauses on its clock until --timeout has passed, not longer") {
  testing::SteppingClock clock;
  const absl::Duration timeout = absl::Seconds(3);
  tandem::v1::RolloutStatus response;
  const absl::Status status =
      CallWorker("drain", RefusingAddress(), {},
                 CommandRetryPolicy(timeout, &clock), &response);
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  const std::vector<absl::Duration> sleeps = clock.sleeps();
  CHECK(sleeps.size() >= 5);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(absl::StrCat("worker drain failed after ",
                                          sleeps.size() + 1, " attempt(s)")));
  CheckRetrySchedule(sleeps, timeout);
}

TEST_CASE(
    "tandemctl's --timeout is also the attempt's real-time gRPC deadline, "
    "and an attempt that runs into it is not repeated") {
  testing::SteppingClock clock;
  const absl::Duration timeout = absl::Seconds(30);
  int attempts = 0;
  absl::Time deadline;
  const absl::Time before = absl::Now();
  const absl::Status status = rpc::CallWithRetry(
      "GetClusterStatus", CommandRetryPolicy(timeout, &clock),
      [&](grpc::ClientContext* context) {
        ++attempts;
        deadline = absl::FromChrono(context->deadline());
        clock.Advance(timeout);  // the coordinator never answered
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow");
      });
  const absl::Time after = absl::Now();
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(attempts == 1);
  CHECK(clock.sleeps().empty());
  // Set in real time (the fake clock reads 2033), `timeout` from the
  // call's start (1 us of slack: chrono time points round to nanoseconds).
  const absl::Duration slack = absl::Microseconds(1);
  CHECK(deadline >= before + timeout - slack);
  CHECK(deadline <= after + timeout + slack);
}

TEST_CASE("tandemctl worker refuses an unknown action, naming it") {
  testing::SteppingClock clock;
  tandem::v1::RolloutStatus response;
  const absl::Status status =
      CallWorker("restart", RefusingAddress(), {},
                 CommandRetryPolicy(absl::Seconds(1), &clock), &response);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Contains("'restart'"));
  CHECK(clock.sleeps().empty());
}

}  // namespace
}  // namespace tandem::ctl
