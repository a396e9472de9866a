#include "common/safetensors/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/posix.h"

namespace tandem::safetensors {
namespace {

absl::Status ErrnoError(int error, absl::string_view path,
                        absl::string_view action) {
  return PosixError(error, absl::StrCat(path, ": ", action, " failed"));
}

absl::Status WriteAll(int fd, const std::string& path,
                      absl::Span<const uint8_t> bytes) {
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status WriteFileAtomically(
    const std::string& path,
    absl::Span<const absl::Span<const uint8_t>> pieces) {
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, tmp, "open");
  absl::Status status;
  for (absl::Span<const uint8_t> piece : pieces) {
    status = WriteAll(fd, tmp, piece);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, tmp, "fsync");
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoError(errno, tmp, "close");
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path, absl::StrCat("rename from ", tmp));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Persist the directory entry. Failure here leaves a complete file that
  // might not survive a power loss; report it all the same.
  const std::string dir = DirectoryOf(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, dir, "open directory");
  if (::fsync(dir_fd) != 0) status = ErrnoError(errno, dir, "fsync directory");
  ::close(dir_fd);
  return status;
}

}  // namespace tandem::safetensors
