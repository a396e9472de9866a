#include "common/base/posix.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::StatusCode CodeOf(int error) {
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status PosixError(int error, absl::string_view context) {
  return absl::Status(CodeOf(error),
                      absl::StrCat(context, ": ", std::strerror(error)));
}

absl::Status FilesystemError(const std::error_code& ec, absl::string_view path,
                             absl::string_view what) {
  const absl::StatusCode code = ec.category() == std::system_category() ||
                                        ec.category() == std::generic_category()
                                    ? CodeOf(ec.value())
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(path, ": ", what, ": ", ec.message()));
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return PosixError(errno, absl::StrCat(dir, ": open directory"));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) return PosixError(error, absl::StrCat(dir, ": fsync directory"));
  return absl::OkStatus();
}

}  // namespace tandem
