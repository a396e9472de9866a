#pragma once

// Internal to Sandbox (sandbox.cc): the directory a sandboxed run works in,
// and its removal once the untrusted program that wrote into it is gone.
//
// Layout: <work_root>/tandem-sandbox-XXXXXX (owned by the daemon, 0711)
// holding "work" (0700; owned by the sandbox user when privileges are
// dropped), the program's cwd, HOME and TMPDIR, with the command's files
// (mode 0444) written in before the program starts. The program cannot
// rename or replace its own cwd because the outer directory is not
// writable by it.

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/verifier/scoring/sandbox.h"

namespace tandem::verifier::sandbox_internal {

class RunDirectory {
 public:
  // Makes the directories under config.work_root and writes
  // command.files into "work"; with `chown_to_sandbox_user`, "work" is
  // then given to `uid` and config.run_as_gid. The error names the path
  // and the call that failed.
  static absl::StatusOr<std::unique_ptr<RunDirectory>> Create(
      const SandboxConfig& config, bool chown_to_sandbox_user, uid_t uid,
      const SandboxCommand& command);
  // Removes the whole tree, whatever the program did to its permissions
  // (never following a symlink it left).
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& outer_dir() const { return outer_; }
  const std::string& work_dir() const { return work_; }

 private:
  explicit RunDirectory(std::string outer)
      : outer_(std::move(outer)), work_(outer_ + "/work") {}

  const std::string outer_;
  const std::string work_;
};

}  // namespace tandem::verifier::sandbox_internal
