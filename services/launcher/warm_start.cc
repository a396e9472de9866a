#include "services/launcher/warm_start.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::launcher {
namespace fs = std::filesystem;

std::string DefaultCacheRoot() {
  if (const char* dir = std::getenv("TANDEM_CACHE_DIR"); dir && *dir) {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return (fs::path(xdg) / "tandem").string();
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return (fs::path(home) / ".cache" / "tandem").string();
  }
  return ".cache/tandem";
}

namespace {

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("signal ", strsignal(WTERMSIG(wait_status)));
  }
  return "unknown status";
}

}  // namespace

absl::StatusOr<std::string> RunWarmStart(
    const WarmStartOptions& options,
    const std::function<void(const std::string&)>& line_sink) {
  std::error_code ec;
  fs::create_directories(options.output_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "warm start: cannot create ", options.output_dir, ": ", ec.message()));
  }
  std::vector<std::string> args = {options.trainer_binary, "sft", "--output",
                                   options.output_dir};
  args.insert(args.end(), options.sft_flags.begin(), options.sft_flags.end());
  const std::string command = absl::StrJoin(args, " ");
  std::ofstream log(options.log_path, std::ios::app);
  log << "$ " << command << "\n";

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("warm start: pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(
        absl::StrCat("warm start: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", argv[0],
                 std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  std::string pending;
  bool open = true;
  int wait_status = 0;
  bool cancelled = false;
  while (true) {
    if (open) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char buffer[4096];
        const ssize_t n = read(fds[0], buffer, sizeof(buffer));
        if (n <= 0) {
          open = false;
        } else {
          pending.append(buffer, static_cast<size_t>(n));
          size_t newline;
          while ((newline = pending.find('\n')) != std::string::npos) {
            const std::string line = pending.substr(0, newline);
            pending.erase(0, newline + 1);
            log << line << "\n" << std::flush;
            line_sink(line);
          }
        }
      }
    }
    timespec zero{0, 0};
    if (!cancelled && sigtimedwait(&stop_signals, nullptr, &zero) > 0) {
      cancelled = true;
      kill(pid, SIGTERM);
    }
    // The output ends (EOF) when the command exits; then reap it.
    if (!open && waitpid(pid, &wait_status, 0) == pid) break;
  }
  close(fds[0]);
  if (!pending.empty()) {
    log << pending << "\n";
    line_sink(pending);
  }
  if (cancelled) {
    return absl::CancelledError("warm start interrupted");
  }
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("warm start failed (", DescribeExit(wait_status),
                     "): ", command, "; see ", options.log_path));
  }
  return options.output_dir;
}

}  // namespace tandem::launcher
