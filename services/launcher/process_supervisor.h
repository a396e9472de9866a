#pragma once

// ProcessSupervisor starts daemons as child processes, restarts any that
// exit while the supervisor runs (with exponential backoff, reset after a
// process stays up long enough), and stops them all on request: SIGTERM,
// a grace period, then SIGKILL. Not thread-safe: drive it from one thread
// by calling Poll() periodically.
//
// The restart backoff and the uptime that resets it are on the clock given
// to the constructor (docs/architecture.md, "The clock seam"); StopAll's
// grace waits for real processes to exit and stays real time.

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace tandem::launcher {

struct ProcessSpec {
  // Unique short name, e.g. "rollout-0".
  std::string name;
  // argv[0] is the executable path.
  std::vector<std::string> argv;
  // stdout and stderr are appended here.
  std::string log_path;
  // Deleted before every (re)start so readers never see a stale one.
  std::string ready_file;
};

class ProcessSupervisor {
 public:
  // Called with a human-readable event line ("rollout-0 exited with code 1;
  // restarting in 1s").
  using EventSink = std::function<void(const std::string&)>;

  // `clock` must outlive the supervisor.
  explicit ProcessSupervisor(EventSink sink, Clock* clock = RealClock());
  ~ProcessSupervisor();

  // Starts a process and supervises it from now on.
  absl::Status Start(const ProcessSpec& spec);
  // Reaps exited children and restarts those whose backoff has elapsed.
  void Poll();
  // SIGTERM to every child but the first, then to the first (the
  // coordinator); each wave may take up to `grace`, then SIGKILL to what is
  // left of it. Returns true when every child exited by itself with code 0.
  bool StopAll(absl::Duration grace);
  // Replaces the argv used for future restarts of `name`.
  void UpdateArgv(const std::string& name, std::vector<std::string> argv);

  pid_t pid(const std::string& name) const;
  int restarts(const std::string& name) const;

 private:
  struct Child {
    ProcessSpec spec;
    pid_t pid = -1;  // -1 while waiting to restart
    absl::Time started;     // on clock_
    absl::Time restart_at;  // on clock_
    int restarts = 0;
    int consecutive_failures = 0;
  };
  absl::Status Spawn(Child* child);
  void HandleExit(Child* child, int wait_status);
  // SIGTERM to children [begin, end), then waits until `give_up` and
  // SIGKILLs what is left. True when all exited with code 0.
  bool StopWave(size_t begin, size_t end, absl::Time give_up);

  EventSink sink_;
  Clock* const clock_;
  std::vector<Child> children_;
  bool stopping_ = false;
};

}  // namespace tandem::launcher
