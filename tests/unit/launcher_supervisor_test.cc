// tandem-local's ProcessSupervisor: restart backoff and the uptime that
// resets it run on a FakeClock (tests/support/fake_clock.h); the children
// are real processes, so waiting for one to exit stays real time.

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/launcher/process_supervisor.h"
#include "tests/support/fake_clock.h"

namespace tandem::launcher {
namespace {

namespace fs = std::filesystem;

class Supervised {
 public:
  explicit Supervised(Clock* clock)
      : log_(fs::temp_directory_path() /
             ("launcher_supervisor_test." + std::to_string(getpid()) + ".log")),
        supervisor_([this](const std::string& e) { events_.push_back(e); },
                    clock) {}
  ~Supervised() {
    supervisor_.StopAll(absl::Seconds(5));
    std::error_code ignored;
    fs::remove(log_, ignored);
  }

  ProcessSupervisor& supervisor() { return supervisor_; }
  std::string log() const { return log_.string(); }

  // Polls (real time, at most 10 s: the child is a real process) until an
  // event line contains `text`, which it returns ("" when none came).
  std::string PollUntilEvent(const std::string& text) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      supervisor_.Poll();
      for (size_t i = seen_; i < events_.size(); ++i) {
        if (absl::StrContains(events_[i], text)) {
          seen_ = i + 1;
          return events_[i];
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return "";
  }

 private:
  fs::path log_;
  std::vector<std::string> events_;
  size_t seen_ = 0;
  ProcessSupervisor supervisor_;
};

TEST_CASE(
    "A child that exits is restarted once its backoff has passed on the "
    "supervisor's clock; the backoff doubles and a stable uptime resets it",
    "[launcher][supervisor]") {
  testing::FakeClock clock;
  Supervised s(&clock);
  ProcessSupervisor& supervisor = s.supervisor();
  const std::vector<std::string> failing = {"/bin/sh", "-c", "exit 3"};
  REQUIRE(
      supervisor.Start({.name = "flaky", .argv = failing, .log_path = s.log()})
          .ok());

  // Each quick failure doubles the backoff: 500 ms, 1 s, 2 s. Poll() does
  // not restart a moment before it has passed, and does at once after.
  int restarts = 0;
  for (const absl::Duration backoff :
       {absl::Milliseconds(500), absl::Seconds(1), absl::Seconds(2)}) {
    INFO("backoff " << absl::FormatDuration(backoff));
    const std::string exited =
        s.PollUntilEvent("restarting in " + absl::FormatDuration(backoff));
    REQUIRE_FALSE(exited.empty());
    CHECK(absl::StrContains(exited, "exited with code 3"));
    clock.Advance(backoff - absl::Milliseconds(1));
    supervisor.Poll();
    CHECK(supervisor.restarts("flaky") == restarts);
    CHECK(supervisor.pid("flaky") < 0);
    if (backoff == absl::Seconds(2)) {
      // The next start stays up.
      supervisor.UpdateArgv("flaky", {"/bin/sh", "-c", "sleep 60"});
    }
    clock.Advance(absl::Milliseconds(1));
    supervisor.Poll();
    CHECK(supervisor.restarts("flaky") == ++restarts);
  }

  // Up for 30 s on the clock (kStableUptime), then killed: the next
  // backoff starts over at 500 ms.
  const pid_t pid = supervisor.pid("flaky");
  REQUIRE(pid > 0);
  clock.Advance(absl::Seconds(30));
  REQUIRE(kill(pid, SIGKILL) == 0);
  const std::string killed = s.PollUntilEvent("restarting in ");
  INFO(killed);
  CHECK(absl::StrContains(killed, "restarting in 500ms"));
}

TEST_CASE("A child killed before a stable uptime backs off longer",
          "[launcher][supervisor]") {
  testing::FakeClock clock;
  Supervised s(&clock);
  ProcessSupervisor& supervisor = s.supervisor();
  REQUIRE(supervisor
              .Start({.name = "short",
                      .argv = {"/bin/sh", "-c", "exit 1"},
                      .log_path = s.log()})
              .ok());
  REQUIRE_FALSE(s.PollUntilEvent("restarting in 500ms").empty());
  supervisor.UpdateArgv("short", {"/bin/sh", "-c", "sleep 60"});
  clock.Advance(absl::Milliseconds(500));
  supervisor.Poll();
  const pid_t pid = supervisor.pid("short");
  REQUIRE(pid > 0);
  // Up 29.9 s on the clock: not stable yet.
  clock.Advance(absl::Seconds(30) - absl::Milliseconds(100));
  REQUIRE(kill(pid, SIGKILL) == 0);
  const std::string killed = s.PollUntilEvent("restarting in ");
  INFO(killed);
  CHECK(absl::StrContains(killed, "restarting in 1s"));
}

}  // namespace
}  // namespace tandem::launcher
