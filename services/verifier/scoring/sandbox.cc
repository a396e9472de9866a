#include "services/verifier/scoring/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/posix.h"
#include "common/base/status_macros.h"
#include "services/verifier/scoring/sandbox_child.h"
#include "services/verifier/scoring/sandbox_run_directory.h"

namespace tandem::verifier {
namespace {

using sandbox_internal::ChildFailure;
using sandbox_internal::ChildSpec;
using sandbox_internal::ChildStageName;
using sandbox_internal::RunDirectory;
using sandbox_internal::SandboxInitMain;

// ---------------------------------------------------------------------------
// Parent side.

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    Reset(other.Release());
    return *this;
  }
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

absl::Status ErrnoStatus(absl::string_view what) {
  return PosixError(errno, what);
}

absl::StatusOr<UniqueFd> MakeStdinFile(const std::string& data) {
  UniqueFd fd(memfd_create("sandbox-stdin", MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("memfd_create");
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n =
        write(fd.get(), data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus("writing stdin");
    written += static_cast<size_t>(n);
  }
  if (lseek(fd.get(), 0, SEEK_SET) != 0) return ErrnoStatus("lseek stdin");
  return fd;
}

// Kills the child and its process group. REQUIRES: the child has not been
// reaped yet, so its pid (and process group id) cannot have been reused.
void KillTree(pid_t pid) {
  kill(pid, SIGKILL);
  killpg(pid, SIGKILL);
}

// True once the child has exited; it stays a zombie (not reaped) so that
// KillTree() remains safe.
bool ChildExited(pid_t pid) {
  siginfo_t info{};
  while (true) {
    if (waitid(P_PID, static_cast<id_t>(pid), &info,
               WEXITED | WNOHANG | WNOWAIT) == 0) {
      return info.si_pid == pid;
    }
    if (errno != EINTR) return true;  // ECHILD: nothing left to wait for.
  }
}

// A pipe as two owned ends.
struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

absl::StatusOr<Pipe> MakePipe(int flags = 0) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | flags) != 0) return ErrnoStatus("pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Strings and pointer arrays for execve(), built before clone() because the
// child must not allocate.
struct ExecStrings {
  std::vector<std::string> strings;
  std::vector<char*> pointers;

  explicit ExecStrings(std::vector<std::string> values)
      : strings(std::move(values)) {
    for (std::string& s : strings) pointers.push_back(s.data());
    pointers.push_back(nullptr);
  }
  ExecStrings(const ExecStrings&) = delete;
  ExecStrings& operator=(const ExecStrings&) = delete;
};

// Waits for the failure report of the child's setup. EOF means the program
// was exec'd; a report means nothing runs, and the init is reaped here.
absl::Status AwaitExec(pid_t pid, const UniqueFd& failure_read,
                       absl::string_view program, int* failed_stage) {
  ChildFailure failure{};
  ssize_t n;
  do {
    n = read(failure_read.get(), &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(failure))) return absl::OkStatus();
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  *failed_stage = failure.stage;
  const std::string message =
      absl::StrCat("sandbox child failed at ", ChildStageName(failure.stage),
                   " (", program, "): ", std::strerror(failure.error));
  if (failure.error == EAGAIN) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// Maps the daemon's uid and gid to themselves in the user namespace of the
// cloned init `pid` (setgroups denied, as an unprivileged process must).
absl::Status WriteUserMaps(pid_t pid) {
  auto write_file = [pid](absl::string_view name,
                          const std::string& text) -> absl::Status {
    const std::string path = absl::StrCat("/proc/", pid, "/", name);
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid() ||
        write(fd.get(), text.data(), text.size()) !=
            static_cast<ssize_t>(text.size())) {
      return ErrnoStatus(absl::StrCat("writing ", path));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(write_file("setgroups", "deny"));
  RETURN_IF_ERROR(
      write_file("uid_map", absl::StrCat(geteuid(), " ", geteuid(), " 1\n")));
  return write_file("gid_map",
                    absl::StrCat(getegid(), " ", getegid(), " 1\n"));
}

// Why the parent ended a run early.
struct Interruption {
  bool timed_out = false;
  bool output_overflow = false;
  // The caller's deadline passed or it cancelled the run.
  bool stopped = false;
};

// How often a run whose caller may cancel it looks at the flag.
constexpr absl::Duration kCancelPollInterval = absl::Milliseconds(50);

// Collects the output of the started run until the init has exited and
// the pipes are closed, killing the run on the wall-clock deadline, on the
// caller's deadline `stop_at` or its `cancelled` flag, or when an output
// passes `cap` bytes. Does not reap the init, except on error.
absl::StatusOr<Interruption> Supervise(pid_t pid, absl::Time deadline,
                                       absl::Time stop_at,
                                       const std::atomic<bool>* cancelled,
                                       size_t cap, UniqueFd out, UniqueFd err,
                                       SandboxResult* result) {
  struct Stream {
    UniqueFd fd;
    std::string* data;
  };
  Stream streams[2] = {{std::move(out), &result->stdout_data},
                       {std::move(err), &result->stderr_data}};
  for (Stream& s : streams) fcntl(s.fd.get(), F_SETFL, O_NONBLOCK);
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  // After a kill, how long to wait for the pipes to close. Only a process
  // that escaped the group in fallback mode can hold them longer.
  constexpr absl::Duration kDrainAfterKill = absl::Seconds(2);

  Interruption interruption;
  bool exited = false;
  bool killed = false;
  absl::Time kill_time;
  auto kill_run = [&] {
    if (killed) return;
    KillTree(pid);
    killed = true;
    kill_time = absl::Now();
  };
  char buffer[64 * 1024];
  while (true) {
    if (!exited && ChildExited(pid)) {
      exited = true;
      // Kills background processes left in the group (fallback mode; with
      // a PID namespace the kernel has killed them already).
      KillTree(pid);
    }
    const bool streams_open = streams[0].fd.valid() || streams[1].fd.valid();
    if (exited && !streams_open) break;
    const absl::Time now = absl::Now();
    if (!exited && !killed &&
        (now >= stop_at || (cancelled != nullptr && cancelled->load()))) {
      interruption.stopped = true;
      kill_run();
    }
    if (now >= deadline) {
      if (exited) break;  // Only escaped writers keep the pipes open.
      if (!killed) interruption.timed_out = true;
      kill_run();
    }
    if (killed && exited && now >= kill_time + kDrainAfterKill) break;

    pollfd fds[3];
    nfds_t nfds = 0;
    for (Stream& s : streams) {
      if (s.fd.valid()) fds[nfds++] = {s.fd.get(), POLLIN, 0};
    }
    const bool watch_pid = pidfd.valid() && !exited;
    if (watch_pid) fds[nfds++] = {pidfd.get(), POLLIN, 0};
    absl::Duration wait =
        killed ? absl::Milliseconds(50) : std::min(deadline, stop_at) - now;
    if (cancelled != nullptr) wait = std::min(wait, kCancelPollInterval);
    // Without a pidfd, exit is noticed by polling waitid().
    if (!watch_pid && !exited) wait = std::min(wait, absl::Milliseconds(10));
    const int timeout_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(wait) + 1, 1, 1000));
    if (poll(fds, nfds, timeout_ms) < 0 && errno != EINTR) {
      const absl::Status status = ErrnoStatus("poll");
      KillTree(pid);
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      return status;
    }
    for (Stream& s : streams) {
      if (!s.fd.valid()) continue;
      const ssize_t got = read(s.fd.get(), buffer, sizeof(buffer));
      if (got > 0) {
        const size_t room = cap - s.data->size();
        s.data->append(buffer, std::min(room, static_cast<size_t>(got)));
        if (static_cast<size_t>(got) > room) {
          interruption.output_overflow = true;
          s.fd.Reset();  // Stop reading; the writer blocks until killed.
          kill_run();
        }
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        s.fd.Reset();
      }
    }
  }
  return interruption;
}

}  // namespace

absl::Status ValidateSandboxConfig(const SandboxConfig& config) {
  const SandboxLimits& l = config.limits;
  auto positive = [](absl::string_view field, auto value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("sandbox.limits.", field, " must be > 0, got ", value));
  };
  RETURN_IF_ERROR(positive("cpu_seconds", l.cpu_seconds));
  RETURN_IF_ERROR(positive("wall_seconds", l.wall_seconds));
  if (!std::isfinite(l.wall_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sandbox.limits.wall_seconds must be finite, got ", l.wall_seconds));
  }
  RETURN_IF_ERROR(positive("address_space_bytes", l.address_space_bytes));
  RETURN_IF_ERROR(positive("file_size_bytes", l.file_size_bytes));
  RETURN_IF_ERROR(positive("max_processes", l.max_processes));
  RETURN_IF_ERROR(positive("max_output_bytes", l.max_output_bytes));
  if (l.max_open_files < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sandbox.limits.max_open_files must be >= 8 (interpreters need a "
        "few), got ",
        l.max_open_files));
  }
  if (config.work_root.empty() || config.work_root.front() != '/' ||
      config.work_root.find_first_not_of('/') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sandbox.work_root must be an absolute path other than /, got \"",
        config.work_root, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Sandbox>> Sandbox::Create(
    const SandboxConfig& config) {
  RETURN_IF_ERROR(ValidateSandboxConfig(config));
  struct stat st {};
  if (stat(config.work_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sandbox.work_root \"", config.work_root, "\" is not a directory"));
  }
  return std::unique_ptr<Sandbox>(new Sandbox(config));
}

uid_t Sandbox::AcquireUid() const {
  absl::MutexLock lock(&uid_mu_);
  size_t slot = 0;
  while (slot < uid_busy_.size() && uid_busy_[slot]) ++slot;
  if (slot == uid_busy_.size()) uid_busy_.push_back(false);
  uid_busy_[slot] = true;
  return slot == 0 ? config_.run_as_uid
                   : kConcurrentUidBase + static_cast<uid_t>(slot);
}

void Sandbox::ReleaseUid(uid_t uid) const {
  absl::MutexLock lock(&uid_mu_);
  const size_t slot = uid == config_.run_as_uid
                          ? 0
                          : static_cast<size_t>(uid - kConcurrentUidBase);
  if (slot < uid_busy_.size()) uid_busy_[slot] = false;
}

absl::StatusOr<SandboxResult> Sandbox::Run(
    const SandboxCommand& command) const {
  if (command.argv.empty() || command.argv[0].empty() ||
      command.argv[0].front() != '/') {
    return absl::InvalidArgumentError(
        "sandbox command argv[0] must be an absolute path");
  }
  for (const auto& [name, content] : command.files) {
    if (name.empty() || name == "." || name == ".." ||
        name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sandbox file name must be a plain file name, got \"", name, "\""));
    }
  }
  if (command.cancelled != nullptr && command.cancelled->load()) {
    return absl::CancelledError("the run was cancelled before it started");
  }
  if (absl::Now() >= command.deadline) {
    return absl::DeadlineExceededError(
        "the caller's deadline passed before the run started");
  }
  const SandboxLimits& limits = config_.limits;
  const bool drop_privileges = geteuid() == 0;

  const uid_t uid = drop_privileges ? AcquireUid() : config_.run_as_uid;
  absl::Cleanup release_uid = [&] {
    if (drop_privileges) ReleaseUid(uid);
  };
  ASSIGN_OR_RETURN(
      std::unique_ptr<RunDirectory> dir,
      RunDirectory::Create(config_, drop_privileges, uid, command));

  const ExecStrings argv(command.argv);
  const ExecStrings envp({
      "PATH=/usr/local/bin:/usr/bin:/bin",
      "HOME=" + dir->work_dir(),
      "TMPDIR=" + dir->work_dir(),
      "LANG=C.UTF-8",
  });
  // Directories hidden under an empty tmpfs in a private view, except those
  // that contain work_root (hiding them would hide the run directory).
  std::vector<std::string> hidden;
  for (const char* candidate :
       {"/run", "/dev/shm", "/var/tmp", "/home", "/root", "/mnt", "/media"}) {
    const std::string dir_path = candidate;
    if (config_.work_root == dir_path ||
        absl::StartsWith(config_.work_root, dir_path + "/")) {
      continue;
    }
    hidden.push_back(dir_path);
  }
  std::vector<const char*> hidden_dirs;
  for (const std::string& h : hidden) hidden_dirs.push_back(h.c_str());
  hidden_dirs.push_back(nullptr);
  auto rl = [](int64_t soft, int64_t hard) {
    return rlimit{static_cast<rlim_t>(soft), static_cast<rlim_t>(hard)};
  };

  // Isolation tiers, strongest first: private mounts + network + PID
  // namespaces; network + PID namespaces; none (only with
  // allow_network_fallback).
  enum class Tier { kPrivateMounts, kNamespaces, kNone };
  Tier tier = config_.private_filesystem ? Tier::kPrivateMounts
                                         : Tier::kNamespaces;
  UniqueFd out_read, err_read, status_read;
  pid_t pid = -1;
  absl::Time start;
  while (true) {
    ASSIGN_OR_RETURN(UniqueFd stdin_file, MakeStdinFile(command.stdin_data));
    ASSIGN_OR_RETURN(Pipe out, MakePipe());
    ASSIGN_OR_RETURN(Pipe err, MakePipe());
    ASSIGN_OR_RETURN(Pipe failure, MakePipe());
    ASSIGN_OR_RETURN(Pipe status, MakePipe(O_NONBLOCK));
    // Without root the namespaces come with a user namespace of their own,
    // which the daemon may create unprivileged where the kernel allows it.
    const bool user_namespace = !drop_privileges && tier != Tier::kNone;
    ASSIGN_OR_RETURN(Pipe user_map_ready, MakePipe());
    const ChildSpec spec{
        .stdin_fd = stdin_file.get(),
        .stdout_fd = out.write.get(),
        .stderr_fd = err.write.get(),
        .failure_fd = failure.write.get(),
        .status_fd = status.write.get(),
        .work_dir = dir->work_dir().c_str(),
        .argv = argv.pointers.data(),
        .envp = envp.pointers.data(),
        .drop_privileges = drop_privileges,
        .uid = uid,
        .gid = config_.run_as_gid,
        .rlimits = {
            {RLIMIT_CPU, rl(limits.cpu_seconds, limits.cpu_seconds + 1)},
            {RLIMIT_AS,
             rl(limits.address_space_bytes, limits.address_space_bytes)},
            {RLIMIT_FSIZE,
             rl(limits.file_size_bytes, limits.file_size_bytes)},
            {RLIMIT_NPROC, rl(limits.max_processes, limits.max_processes)},
            {RLIMIT_NOFILE, rl(limits.max_open_files, limits.max_open_files)},
            {RLIMIT_CORE, rl(0, 0)},
        },
        .private_mounts = tier == Tier::kPrivateMounts,
        .work_root = config_.work_root.c_str(),
        .outer_dir = dir->outer_dir().c_str(),
        .hidden_dirs = hidden_dirs.data(),
        .user_map_ready_fd = user_namespace ? user_map_ready.read.get() : -1,
    };

    // The init runs on its own stack in a copy of this address space.
    constexpr size_t kInitStackBytes = 256 * 1024;
    std::vector<char> stack(kInitStackBytes);
    char* stack_top = stack.data() + stack.size();
    stack_top -= reinterpret_cast<uintptr_t>(stack_top) % 64;
    void* spec_arg = const_cast<ChildSpec*>(&spec);
    int flags = SIGCHLD;
    if (tier != Tier::kNone) flags |= CLONE_NEWNET | CLONE_NEWPID;
    if (tier == Tier::kPrivateMounts) flags |= CLONE_NEWNS;
    if (user_namespace) flags |= CLONE_NEWUSER;
    if (tier != Tier::kNone && simulate_namespace_failure_.load()) {
      pid = -1;
      errno = EPERM;
    } else if (tier == Tier::kPrivateMounts &&
               simulate_mount_failure_.load()) {
      pid = -1;
      errno = EPERM;
    } else {
      pid = clone(&SandboxInitMain, stack_top, flags, spec_arg);
    }
    // The namespaces of this tier were refused: the next tier, or an
    // error when there is none.
    auto step_down = [&](const std::string& why) -> absl::Status {
      if (tier == Tier::kPrivateMounts) {
        tier = Tier::kNamespaces;
        return absl::OkStatus();
      }
      if (tier == Tier::kNamespaces && limits.allow_network_fallback) {
        tier = Tier::kNone;
        return absl::OkStatus();
      }
      return absl::UnavailableError(absl::StrCat(
          "cannot create network and PID namespaces (", why,
          "); refusing to run untrusted code without them (set "
          "allow_network_fallback to run unisolated)"));
    };
    if (pid < 0) {
      const int error = errno;
      if (error == EAGAIN || error == ENOMEM) {
        return absl::ResourceExhaustedError(
            absl::StrCat("clone: ", std::strerror(error)));
      }
      if (tier == Tier::kNone) return ErrnoStatus("clone");
      RETURN_IF_ERROR(step_down(std::strerror(error)));
      continue;
    }
    if (user_namespace) {
      // The program keeps the daemon's uid and gid (mapped to themselves);
      // the init has capabilities only inside the new namespaces.
      if (absl::Status mapped = WriteUserMaps(pid); !mapped.ok()) {
        KillTree(pid);
        while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        // E.g. a daemon that is not dumpable cannot write its child's maps.
        RETURN_IF_ERROR(step_down(std::string(mapped.message())));
        continue;
      }
      if (write(user_map_ready.write.get(), "1", 1) != 1) {
        const absl::Status status = ErrnoStatus("waking the sandbox init");
        KillTree(pid);
        while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        return status;
      }
    }
    start = absl::Now();
    out.write.Reset();
    err.write.Reset();
    failure.write.Reset();
    status.write.Reset();
    stdin_file.Reset();
    int failed_stage = 0;
    absl::Status exec_status =
        AwaitExec(pid, failure.read, command.argv[0], &failed_stage);
    if (!exec_status.ok() && tier == Tier::kPrivateMounts &&
        failed_stage == sandbox_internal::kStageMounts) {
      // A restrictive kernel or container (e.g. a seccomp filter on mount):
      // keep the namespaces, lose the private view.
      tier = Tier::kNamespaces;
      continue;
    }
    RETURN_IF_ERROR(exec_status);
    out_read = std::move(out.read);
    err_read = std::move(err.read);
    status_read = std::move(status.read);
    break;
  }

  SandboxResult result;
  result.isolated = tier != Tier::kNone;
  result.private_filesystem = tier == Tier::kPrivateMounts;
  ASSIGN_OR_RETURN(
      const Interruption interruption,
      Supervise(pid, start + absl::Seconds(limits.wall_seconds),
                command.deadline, command.cancelled,
                static_cast<size_t>(limits.max_output_bytes),
                std::move(out_read), std::move(err_read), &result));

  int init_status = 0;
  rusage usage{};
  while (wait4(pid, &init_status, 0, &usage) < 0 && errno == EINTR) {
  }
  // The program's own wait status, relayed by the init; absent when the
  // init was killed (timeout, output overflow), and then the program died
  // with it by SIGKILL.
  int program_status = 0;
  if (read(status_read.get(), &program_status, sizeof(program_status)) !=
      static_cast<ssize_t>(sizeof(program_status))) {
    program_status = init_status;
  }
  result.wall_time = absl::Now() - start;
  result.cpu_time = absl::DurationFromTimeval(usage.ru_utime) +
                    absl::DurationFromTimeval(usage.ru_stime);
  if (WIFSIGNALED(program_status)) result.signal = WTERMSIG(program_status);
  if (WIFEXITED(program_status)) result.exit_code = WEXITSTATUS(program_status);
  if (interruption.stopped) {
    result.termination = SandboxTermination::kStopped;
  } else if (interruption.output_overflow) {
    result.termination = SandboxTermination::kOutputLimit;
  } else if (interruption.timed_out) {
    result.termination = SandboxTermination::kWallTimeout;
  } else if (WIFSIGNALED(program_status)) {
    result.termination = SandboxTermination::kSignaled;
  } else {
    result.termination = SandboxTermination::kExited;
  }
  return result;
}

}  // namespace tandem::verifier
