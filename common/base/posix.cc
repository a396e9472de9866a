#include "common/base/posix.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
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

absl::StatusOr<int> ListenTcp4(const std::string& host, uint16_t port,
                               int socket_flags, uint16_t* bound_port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", host, "' is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | socket_flags, 0);
  if (fd < 0) return PosixError(errno, absl::StrCat("socket for ", host));
  socklen_t len = sizeof(addr);
  const int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    close(fd);
    return PosixError(error, absl::StrCat("listen on ", host, ":", port));
  }
  *bound_port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace tandem
