#include "services/launcher/process_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::launcher {
namespace {

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(500);
constexpr absl::Duration kMaxBackoff = absl::Seconds(10);
// A process that stayed up this long is healthy again: backoff resets.
constexpr absl::Duration kStableUptime = absl::Seconds(30);

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status), " (",
                        strsignal(WTERMSIG(wait_status)), ")");
  }
  return "stopped";
}

}  // namespace

ProcessSupervisor::ProcessSupervisor(EventSink sink, Clock* clock)
    : sink_(std::move(sink)), clock_(clock) {}

ProcessSupervisor::~ProcessSupervisor() { StopAll(absl::Seconds(5)); }

absl::Status ProcessSupervisor::Spawn(Child* child) {
  const ProcessSpec& spec = child->spec;
  if (!spec.ready_file.empty()) std::remove(spec.ready_file.c_str());
  int log_fd = open(spec.log_path.c_str(),
                    O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open log ", spec.log_path,
                                            ": ", std::strerror(errno)));
  }
  std::vector<char*> argv;
  for (const std::string& arg : spec.argv) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(
        absl::StrCat("fork for ", spec.name, ": ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: own process group (Ctrl-C reaches only the launcher, which
    // stops children in order), die with the launcher, default signal mask.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execv(argv[0], argv.data());
    dprintf(STDERR_FILENO, "exec %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(log_fd);
  child->pid = pid;
  child->started = clock_->Now();
  return absl::OkStatus();
}

absl::Status ProcessSupervisor::Start(const ProcessSpec& spec) {
  Child child;
  child.spec = spec;
  if (absl::Status s = Spawn(&child); !s.ok()) return s;
  sink_(absl::StrCat("started ", spec.name, " (pid ", child.pid, ")"));
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

void ProcessSupervisor::HandleExit(Child* child, int wait_status) {
  const std::string how = DescribeExit(wait_status);
  child->pid = -1;
  if (stopping_) return;
  const absl::Duration uptime = clock_->Now() - child->started;
  if (uptime >= kStableUptime) child->consecutive_failures = 0;
  absl::Duration backoff = kInitialBackoff;
  for (int i = 0; i < child->consecutive_failures && backoff < kMaxBackoff;
       ++i) {
    backoff *= 2;
  }
  backoff = std::min(backoff, kMaxBackoff);
  ++child->consecutive_failures;
  child->restart_at = clock_->Now() + backoff;
  sink_(absl::StrCat(child->spec.name, " ", how, "; restarting in ",
                     absl::FormatDuration(backoff), " (see ",
                     child->spec.log_path, ")"));
}

void ProcessSupervisor::Poll() {
  for (Child& child : children_) {
    if (child.pid > 0) {
      int wait_status = 0;
      const pid_t r = waitpid(child.pid, &wait_status, WNOHANG);
      if (r == child.pid) HandleExit(&child, wait_status);
    }
    if (child.pid < 0 && !stopping_ && clock_->Now() >= child.restart_at) {
      if (absl::Status s = Spawn(&child); s.ok()) {
        ++child.restarts;
        sink_(absl::StrCat("restarted ", child.spec.name, " (pid ", child.pid,
                           ", restart ", child.restarts, ")"));
      } else {
        sink_(absl::StrCat("cannot restart ", child.spec.name, ": ",
                           s.message()));
        child.restart_at = clock_->Now() + kMaxBackoff;
      }
    }
  }
}

bool ProcessSupervisor::StopAll(absl::Duration grace) {
  stopping_ = true;
  if (children_.empty()) return true;
  // Two waves: every process started after the first (the members) stops
  // together, then the first (the coordinator), so members can deregister.
  // Each wave has the whole grace period: members that use their full
  // drain deadline must not eat the coordinator's.
  bool all_clean = StopWave(1, children_.size(), absl::Now() + grace);
  return StopWave(0, 1, absl::Now() + grace) && all_clean;
}

bool ProcessSupervisor::StopWave(size_t begin, size_t end, absl::Time give_up) {
  bool all_clean = true;
  for (size_t i = begin; i < end; ++i) {
    if (children_[i].pid > 0) kill(children_[i].pid, SIGTERM);
  }
  for (size_t i = begin; i < end; ++i) {
    Child& child = children_[i];
    while (child.pid > 0) {
      int wait_status = 0;
      const pid_t r = waitpid(child.pid, &wait_status, WNOHANG);
      if (r == child.pid) {
        const bool clean =
            WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
        if (!clean) {
          all_clean = false;
          sink_(absl::StrCat(child.spec.name, " ", DescribeExit(wait_status),
                             " during shutdown"));
        }
        child.pid = -1;
        break;
      }
      if (absl::Now() >= give_up) {
        sink_(
            absl::StrCat(child.spec.name, " did not stop in time; killing it"));
        kill(child.pid, SIGKILL);
        waitpid(child.pid, &wait_status, 0);
        child.pid = -1;
        all_clean = false;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  return all_clean;
}

void ProcessSupervisor::UpdateArgv(const std::string& name,
                                   std::vector<std::string> argv) {
  for (Child& child : children_) {
    if (child.spec.name == name) child.spec.argv = std::move(argv);
  }
}

pid_t ProcessSupervisor::pid(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.spec.name == name) return child.pid;
  }
  return -1;
}

int ProcessSupervisor::restarts(const std::string& name) const {
  for (const Child& child : children_) {
    if (child.spec.name == name) return child.restarts;
  }
  return 0;
}

}  // namespace tandem::launcher
