#pragma once

// A process sandbox for running untrusted programs (the "code" verifier).
//
// Each Run() clones a small init process (sandbox_child.h) that forks the
// program and relays its exit status. They are contained by:
//   - fresh network and PID namespaces, created by clone(CLONE_NEWNET |
//     CLONE_NEWPID). In the new network namespace even loopback is down, so
//     every connect() fails. The init is PID 1 of the PID namespace, so when
//     the program exits, or the init is killed, the kernel kills every
//     process the program started, including ones that left its process
//     group with setsid(). Concurrent runs cannot see or signal each other.
//     (This is the unshare(CLONE_NEWNET) of the design, done at clone time
//     so that the PID namespace comes with it.)
//   - a new session (setsid) and process group; the parent SIGKILLs the
//     init and the group on wall-clock timeout, on output overflow, and
//     after the program exits (which reaps background children in fallback
//     mode);
//   - setrlimit on the program: RLIMIT_CPU (soft cpu_seconds, SIGXCPU; hard
//     one more, SIGKILL), RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC,
//     RLIMIT_NOFILE, and no core dumps;
//   - when the daemon does not run as root: the namespaces are created
//     together with a user namespace (CLONE_NEWUSER) that maps the daemon's
//     uid and gid to themselves, which the kernel allows unprivileged
//     processes where user namespaces are enabled; the program runs as the
//     daemon's uid without capabilities, and the init has capabilities only
//     inside the run's namespaces (enough for the private view);
//   - when the daemon runs as root: supplementary groups dropped and
//     setresgid/setresuid to run_as_gid/run_as_uid (nobody, 65534) in the
//     program, after the namespaces exist; runs under way at the same time
//     each get a uid of their own (run_as_uid for the first, then
//     kConcurrentUidBase + k), because RLIMIT_NPROC counts all processes of
//     a uid: with one shared uid a fork bomb in one run made a concurrent
//     run's execve fail with EAGAIN; PR_SET_NO_NEW_PRIVS so setuid
//     binaries cannot regain privileges; the init has PR_SET_PDEATHSIG, so
//     the run dies with the daemon;
//   - its own new, empty directory under work_root as cwd, HOME and TMPDIR,
//     owned by the sandbox user with mode 0700 inside a daemon-owned 0711
//     directory, removed (recursively) after the run whatever happened;
//   - a private filesystem view (mount namespace, CLONE_NEWNS), when
//     private_filesystem is set and the kernel allows it: every mount is
//     made private (nothing propagates back), work_root and /run, /dev/shm,
//     /var/tmp, /home, /root, /mnt, /media (those that do not contain
//     work_root) are covered by empty tmpfs, so other runs' directories and
//     the daemon's sockets are out of sight; the run directory is mounted
//     back at its own path; /proc is a new procfs of the PID namespace
//     (only the run's processes); then the whole tree is read-only and
//     nosuid except the run directory. The program can write nowhere but
//     its own directory, and all of it disappears with the namespace.
//   - stdin from an in-memory file, stdout and stderr through pipes, each
//     capped at max_output_bytes: past the cap the parent stops reading and
//     kills the run;
//   - every other inherited file descriptor closed (close_range), and a
//     minimal environment (PATH, HOME, TMPDIR, LANG).
//
// Isolation is tried in tiers, strongest first:
//   1. private filesystem view + network + PID namespaces;
//   2. network + PID namespaces (the mount namespace or one of its mounts
//      was refused, e.g. by a seccomp filter, or private_filesystem is off):
//      SandboxResult::private_filesystem is false;
//   3. none. If the namespaces of tier 2 cannot be created (root without
//      CAP_SYS_ADMIN; without root, user namespaces disabled; a restrictive
//      container), Run() returns Unavailable
//      and runs nothing, unless allow_network_fallback is set: then the
//      program runs without network and PID isolation, contained only by
//      the process-group kill, and SandboxResult::isolated is false.
//
// Caveats, by design of the mechanisms used:
//   - RLIMIT_NPROC counts all processes of the real uid. Concurrent runs
//     share the sandbox uid, so one fork bomb can make another concurrent
//     run fail to start (ResourceExhausted) until it is killed. When not
//     running as root the limit counts the daemon user's own processes, so
//     max_processes must leave room for them.
//   - Without the private filesystem view (tier 2 below) the program can
//     read what nobody can read, and write where nobody can write (e.g.
//     /tmp outside its directory; such files outlive the run), and see the
//     daemon's processes in /proc. RLIMIT_FSIZE bounds each file, not
//     their number.
//
// Thread-safe: Run() may be called concurrently; each run has its own
// directory, pipes and processes.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::verifier {

struct SandboxLimits {
  int cpu_seconds = 5;                             // RLIMIT_CPU.
  double wall_seconds = 10.0;                      // Enforced by parent.
  int64_t address_space_bytes = int64_t{1} << 30;  // RLIMIT_AS, 1 GiB.
  int64_t file_size_bytes = int64_t{16} << 20;     // RLIMIT_FSIZE, 16 MiB.
  int max_processes = 64;                          // RLIMIT_NPROC.
  int64_t max_output_bytes = int64_t{1} << 20;     // Per stream, 1 MiB.
  int max_open_files = 64;                         // RLIMIT_NOFILE.
  // Run without network/PID namespaces when they cannot be created,
  // instead of refusing. Off by default: never run code unisolated unless
  // the operator says so.
  bool allow_network_fallback = false;
};

// Uids of the second and later runs under way at the same time (root).
inline constexpr uid_t kConcurrentUidBase = 2000000000;

struct SandboxConfig {
  SandboxLimits limits;
  // Parent of the per-run directories; must exist and be searchable by the
  // sandbox user.
  std::string work_root = "/tmp";
  // Identity of the program when the daemon runs as root.
  uid_t run_as_uid = 65534;
  gid_t run_as_gid = 65534;
  // Give each run a private filesystem view (tier 1 above) where the
  // kernel allows it.
  bool private_filesystem = true;
};

// OK, or InvalidArgument naming the first bad field, e.g.
// "sandbox.limits.cpu_seconds must be > 0, got 0".
absl::Status ValidateSandboxConfig(const SandboxConfig& config);

struct SandboxCommand {
  // argv[0] is an absolute path; it is executed as is (no PATH lookup).
  std::vector<std::string> argv;
  std::string stdin_data;
  // Files written into the run directory before the program starts, as
  // (plain file name, content); mode 0444.
  std::vector<std::pair<std::string, std::string>> files;
  // The caller's limits on top of wall_seconds: the run is killed when
  // `deadline` passes or when `*cancelled` becomes true (checked every
  // 50 ms), and ends as kStopped. A run asked for after either is not
  // started (DeadlineExceeded / Cancelled).
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* cancelled = nullptr;
};

enum class SandboxTermination {
  kExited,       // exit_code is valid.
  kSignaled,     // Killed by `signal` (SIGXCPU: CPU limit; SIGXFSZ: file).
  kWallTimeout,  // Killed by the parent at wall_seconds.
  kOutputLimit,  // Killed by the parent past max_output_bytes.
  kStopped,      // Killed by the parent: the caller's deadline or cancel.
};

struct SandboxResult {
  SandboxTermination termination = SandboxTermination::kExited;
  int exit_code = -1;
  int signal = 0;
  std::string stdout_data;  // At most max_output_bytes.
  std::string stderr_data;  // At most max_output_bytes.
  absl::Duration wall_time;
  // User + system CPU of the program and the processes that were reaped
  // inside the run (approximate when the run was killed).
  absl::Duration cpu_time;
  // False only when run under allow_network_fallback without namespaces.
  bool isolated = true;
  // True when the run had the private filesystem view.
  bool private_filesystem = false;
};

class Sandbox {
 public:
  // InvalidArgument when the config is invalid or work_root is not a
  // directory.
  static absl::StatusOr<std::unique_ptr<Sandbox>> Create(
      const SandboxConfig& config);

  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Runs `command` to completion under the limits. A program that fails,
  // loops, hogs memory or floods output is a SandboxResult, not an error.
  // Errors: InvalidArgument (bad command), Unavailable (namespaces cannot
  // be created and no fallback allowed; nothing ran), ResourceExhausted
  // (the process could not start, e.g. RLIMIT_NPROC of the sandbox user is
  // used up by concurrent runs), Internal (a system call of the parent
  // failed), DeadlineExceeded / Cancelled (command.deadline had passed or
  // command.cancelled was set before the run started; nothing ran). The run directory is removed in every case.
  // REQUIRES: SIGCHLD is not ignored (SIG_IGN) in this process; the exit
  // status of the run would be lost.
  absl::StatusOr<SandboxResult> Run(const SandboxCommand& command) const;

  const SandboxConfig& config() const { return config_; }

  // Makes namespace creation fail as if the kernel refused it, to test the
  // refusal and the fallback without a restricted kernel.
  void SimulateNamespaceFailureForTest(bool fail) {
    simulate_namespace_failure_.store(fail);
  }
  // Makes the mount namespace fail alone, to test the fall back to tier 2.
  void SimulateMountNamespaceFailureForTest(bool fail) {
    simulate_mount_failure_.store(fail);
  }

 private:
  explicit Sandbox(SandboxConfig config) : config_(std::move(config)) {}
  // Root only: the uid of a run starting now, held until ReleaseUid.
  uid_t AcquireUid() const;
  void ReleaseUid(uid_t uid) const;

  const SandboxConfig config_;
  mutable absl::Mutex uid_mu_;
  // Slot k (uid run_as_uid for 0, kConcurrentUidBase + k after) is in use.
  mutable std::vector<bool> uid_busy_ ABSL_GUARDED_BY(uid_mu_);
  std::atomic<bool> simulate_namespace_failure_{false};
  std::atomic<bool> simulate_mount_failure_{false};
};

}  // namespace tandem::verifier
