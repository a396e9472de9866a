#include "services/verifier/scoring/sandbox_run_directory.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/posix.h"

namespace tandem::verifier::sandbox_internal {
namespace {

absl::Status ErrnoStatus(absl::string_view what) {
  return PosixError(errno, what);
}

// Removes a directory tree that an untrusted program wrote into. When not
// running as root the program may have removed permissions from its own
// directories, so on failure every directory is made accessible and the
// removal retried. Never follows symlinks.
void RemoveTree(const std::string& path) {
  namespace fs = std::filesystem;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (!ec) return;
    chmod(path.c_str(), 0700);
    fs::recursive_directory_iterator it(
        path, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code status_ec;
      if (it->symlink_status(status_ec).type() == fs::file_type::directory) {
        chmod(it->path().c_str(), 0700);
      }
    }
  }
}

// Creates `path` (which must not exist) with mode 0444 and `content`.
absl::Status WriteNewFile(const std::string& path, const std::string& content) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0) return ErrnoStatus(absl::StrCat("creating ", path));
  absl::Cleanup close_fd = [fd] { close(fd); };
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n =
        write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(absl::StrCat("writing ", path));
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunDirectory>> RunDirectory::Create(
    const SandboxConfig& config, bool chown_to_sandbox_user, uid_t uid,
    const SandboxCommand& command) {
  std::string outer = absl::StrCat(config.work_root, "/tandem-sandbox-XXXXXX");
  if (mkdtemp(outer.data()) == nullptr) {
    return ErrnoStatus(absl::StrCat("mkdtemp in ", config.work_root));
  }
  auto dir = std::unique_ptr<RunDirectory>(new RunDirectory(outer));
  if (chmod(outer.c_str(), 0711) != 0) {
    return ErrnoStatus(absl::StrCat("chmod ", outer));
  }
  const std::string& work = dir->work_dir();
  if (mkdir(work.c_str(), 0700) != 0) {
    return ErrnoStatus(absl::StrCat("mkdir ", work));
  }
  for (const auto& [name, content] : command.files) {
    absl::Status written = WriteNewFile(absl::StrCat(work, "/", name), content);
    if (!written.ok()) return written;
  }
  if (chown_to_sandbox_user &&
      chown(work.c_str(), uid, config.run_as_gid) != 0) {
    return ErrnoStatus(absl::StrCat("chown ", work));
  }
  return dir;
}

RunDirectory::~RunDirectory() { RemoveTree(outer_); }

}  // namespace tandem::verifier::sandbox_internal
