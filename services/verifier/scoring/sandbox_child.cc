#include "services/verifier/scoring/sandbox_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace tandem::verifier::sandbox_internal {
namespace {

[[noreturn]] void Fail(int stage) {
  const ChildFailure failure{stage, errno};
  ssize_t unused = write(kFailureFd, &failure, sizeof(failure));
  (void)unused;
  _exit(127);
}

// fork() as a raw system call (see the header for why not glibc's).
pid_t RawFork() {
  return static_cast<pid_t>(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0));
}

// Puts stdin/stdout/stderr at 0/1/2, the failure and status pipes at
// kFailureFd/kStatusFd, and closes every other descriptor.
void ArrangeDescriptors(const ChildSpec& spec) {
  // Lift everything above the target range first, so that no dup below
  // overwrites a descriptor still needed.
  const int in = fcntl(spec.stdin_fd, F_DUPFD_CLOEXEC, 10);
  const int out = fcntl(spec.stdout_fd, F_DUPFD_CLOEXEC, 10);
  const int err = fcntl(spec.stderr_fd, F_DUPFD_CLOEXEC, 10);
  const int failure = fcntl(spec.failure_fd, F_DUPFD_CLOEXEC, 10);
  const int status = fcntl(spec.status_fd, F_DUPFD_CLOEXEC, 10);
  if (in < 0 || out < 0 || err < 0 || failure < 0 || status < 0 ||
      dup3(failure, kFailureFd, O_CLOEXEC) < 0) {
    // Report on the original descriptor; the dup may not exist.
    const ChildFailure report{kStageDescriptors, errno};
    ssize_t unused = write(spec.failure_fd, &report, sizeof(report));
    (void)unused;
    _exit(127);
  }
  if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
      dup2(err, STDERR_FILENO) < 0 || dup3(status, kStatusFd, O_CLOEXEC) < 0) {
    Fail(kStageDescriptors);
  }
  if (close_range(kStatusFd + 1, ~0U, 0) != 0) {
    rlimit nofile{};
    if (getrlimit(RLIMIT_NOFILE, &nofile) != 0) Fail(kStageDescriptors);
    for (rlim_t fd = kStatusFd + 1; fd < nofile.rlim_cur; ++fd) {
      close(static_cast<int>(fd));
    }
  }
}

[[noreturn]] void ExecProgram(const ChildSpec& spec) {
  close(kStatusFd);
  if (chdir(spec.work_dir) != 0) Fail(kStageChdir);
  for (const ChildRlimit& rl : spec.rlimits) {
    if (setrlimit(static_cast<__rlimit_resource>(rl.resource), &rl.limit) !=
        0) {
      Fail(kStageRlimit);
    }
  }
  if (spec.drop_privileges) {
    // Groups first: after setresuid() they can no longer be changed.
    if (syscall(SYS_setgroups, 0, nullptr) != 0) Fail(kStageDropGroups);
    if (syscall(SYS_setresgid, spec.gid, spec.gid, spec.gid) != 0) {
      Fail(kStageSetGid);
    }
    if (syscall(SYS_setresuid, spec.uid, spec.uid, spec.uid) != 0) {
      Fail(kStageSetUid);
    }
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) Fail(kStageNoNewPrivs);
  execve(spec.argv[0], spec.argv, spec.envp);
  Fail(kStageExec);
}

// See ChildSpec::private_mounts. Runs in the init, before the program is
// forked, with the privileges of the daemon.
void SetUpPrivateMounts(const ChildSpec& spec) {
  // Nothing done here may propagate back to the daemon's namespace.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    Fail(kStageMounts);
  }
  // A detached copy of the run directory, taken before work_root is hidden.
  const int tree = static_cast<int>(
      syscall(SYS_open_tree, AT_FDCWD, spec.work_dir,
              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (tree < 0) Fail(kStageMounts);
  for (const char* const* dir = spec.hidden_dirs; *dir != nullptr; ++dir) {
    if (mount("tmpfs", *dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=16k,mode=0755") != 0 &&
        errno != ENOENT && errno != ENOTDIR) {
      Fail(kStageMounts);
    }
  }
  // Hides the other runs' directories (and the rest of work_root).
  if (mount("tmpfs", spec.work_root, "tmpfs", MS_NOSUID | MS_NODEV,
            "size=64k,mode=0755") != 0 ||
      mkdir(spec.outer_dir, 0711) != 0 || mkdir(spec.work_dir, 0700) != 0 ||
      syscall(SYS_move_mount, tree, "", AT_FDCWD, spec.work_dir,
              MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    Fail(kStageMounts);
  }
  close(tree);
  // The init is PID 1 of the new PID namespace: this /proc shows only the
  // run's processes, not the daemon's command line or environment.
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
            nullptr) != 0) {
    Fail(kStageMounts);
  }
  mount_attr read_only{};
  read_only.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
  if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &read_only,
              sizeof(read_only)) != 0) {
    Fail(kStageMounts);
  }
  mount_attr writable{};
  writable.attr_clr = MOUNT_ATTR_RDONLY;
  if (syscall(SYS_mount_setattr, AT_FDCWD, spec.work_dir, 0, &writable,
              sizeof(writable)) != 0) {
    Fail(kStageMounts);
  }
}

// Ignored signals and the signal mask survive execve(); the daemon's
// (e.g. SIGPIPE ignored, SIGTERM blocked for a sigwait thread) must not
// reach the program, and the init needs SIGCHLD at its default to wait.
void ResetSignals() {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &default_action, nullptr);  // Fails harmlessly for some.
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace

int SandboxInitMain(void* raw_spec) {
  const ChildSpec& spec = *static_cast<const ChildSpec*>(raw_spec);
  if (spec.user_map_ready_fd >= 0) {
    char ready = 0;
    ssize_t n;
    do {
      n = read(spec.user_map_ready_fd, &ready, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) _exit(127);  // The parent gave up and kills us.
  }
  ResetSignals();
  ArrangeDescriptors(spec);
  if (setsid() < 0) Fail(kStageSession);
  // Dies with the daemon; the program then dies with the namespace.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
    Fail(kStageDeathSignal);
  }
  if (spec.private_mounts) SetUpPrivateMounts(spec);
  const pid_t program = RawFork();
  if (program < 0) Fail(kStageFork);
  if (program == 0) ExecProgram(spec);

  // Only the program keeps the pipes open from here on, so the parent sees
  // EOF on them once the program's whole process tree is gone.
  close(kFailureFd);
  close(STDIN_FILENO);
  close(STDOUT_FILENO);
  close(STDERR_FILENO);
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid == program) {
      ssize_t unused = write(kStatusFd, &status, sizeof(status));
      (void)unused;
      _exit(0);
    }
    if (pid < 0 && errno != EINTR) _exit(126);  // Cannot happen.
  }
}

const char* ChildStageName(int stage) {
  switch (stage) {
    case kStageSession:
      return "setsid";
    case kStageDeathSignal:
      return "prctl(PR_SET_PDEATHSIG)";
    case kStageDescriptors:
      return "arranging descriptors";
    case kStageFork:
      return "fork";
    case kStageChdir:
      return "chdir to the run directory";
    case kStageRlimit:
      return "setrlimit";
    case kStageDropGroups:
      return "setgroups";
    case kStageSetGid:
      return "setresgid";
    case kStageSetUid:
      return "setresuid";
    case kStageNoNewPrivs:
      return "prctl(PR_SET_NO_NEW_PRIVS)";
    case kStageExec:
      return "execve";
    case kStageMounts:
      return "private mounts";
  }
  return "child setup";
}

}  // namespace tandem::verifier::sandbox_internal
