#pragma once

// Internal to Sandbox (sandbox.cc): the code that runs in the cloned child
// between clone() and execve().
//
// The cloned process is a small init: PID 1 of the new PID namespace. It
// moves the descriptors into place, forks the program, and waits, reaping
// every orphan, until the program exits; then it writes the program's wait
// status to kStatusFd and exits, which makes the kernel kill whatever the
// program left behind in the namespace. The init exists because PID 1
// ignores signals it has no handler for: as PID 1 the program would survive
// RLIMIT_CPU's SIGXCPU and only die at the hard limit.
//
// The forked program process sets the limits, drops privileges and execs.
// Setup failures of either process are reported as a ChildFailure on
// kFailureFd, which is close-on-exec: EOF there means execve() succeeded.
//
// Everything here runs in a copy of a possibly multithreaded process, so it
// makes raw system calls only: no allocation, no locks, no glibc fork() or
// set*id() wrappers (those coordinate with threads that do not exist in the
// copy). All inputs are prepared by the parent in a ChildSpec.

#include <sys/resource.h>
#include <sys/types.h>

namespace tandem::verifier::sandbox_internal {

// Descriptor numbers inside the child.
inline constexpr int kFailureFd = 3;
inline constexpr int kStatusFd = 4;

enum ChildStage : int {
  kStageSession = 1,
  kStageDeathSignal,
  kStageDescriptors,
  kStageFork,
  kStageChdir,
  kStageRlimit,
  kStageDropGroups,
  kStageSetGid,
  kStageSetUid,
  kStageNoNewPrivs,
  kStageExec,
  kStageMounts,
};

struct ChildFailure {
  int stage;  // ChildStage.
  int error;  // errno.
};

struct ChildRlimit {
  int resource;
  rlimit limit;
};

struct ChildSpec {
  // Descriptors in the parent; any numbers.
  int stdin_fd;
  int stdout_fd;
  int stderr_fd;
  int failure_fd;
  int status_fd;
  const char* work_dir;
  char* const* argv;
  char* const* envp;
  bool drop_privileges;
  uid_t uid;
  gid_t gid;
  ChildRlimit rlimits[6];
  // Private filesystem view; REQUIRES: the init was cloned with
  // CLONE_NEWNS. The init makes every mount private, hides each existing
  // directory of `hidden_dirs` (nullptr-terminated) and `work_root` under
  // an empty tmpfs, mounts the run directory back at the same path
  // (`outer_dir`/work = `work_dir`), mounts a /proc of the new PID
  // namespace, and makes everything read-only and nosuid except the run
  // directory.
  bool private_mounts;
  const char* work_root;
  const char* outer_dir;
  const char* const* hidden_dirs;
  // >= 0 when the init was cloned with CLONE_NEWUSER: it waits for one byte
  // here, written once the parent has set up its uid and gid maps, before
  // anything that needs them (mounts, files).
  int user_map_ready_fd;
};

// clone() entry point; `spec` is a const ChildSpec*. Never returns.
int SandboxInitMain(void* spec);

const char* ChildStageName(int stage);

}  // namespace tandem::verifier::sandbox_internal
