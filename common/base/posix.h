#pragma once

// POSIX and filesystem errors as absl::Status, one way for the whole
// project (the daemons, the journal, checkpoints, the sandbox, safetensors
// files): the message names what was attempted on what, then the system's
// reason; the code follows the error.

#include <cstdint>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// "<context>: <strerror(error)>", with NotFound for ENOENT/ENOTDIR,
// PermissionDenied for EACCES/EPERM/EROFS, ResourceExhausted for
// ENOSPC/EDQUOT and Internal otherwise. Pass errno as read right after the
// failing call (before anything that may change it).
absl::Status PosixError(int error, absl::string_view context);

// "<path>: <what>: <ec.message()>", coded as PosixError codes ec's value
// when it is a system error, Internal otherwise.
absl::Status FilesystemError(const std::error_code& ec, absl::string_view path,
                             absl::string_view what);

// fsync of directory `dir`, so that entries created or renamed in it are
// durable. Errors name the directory and the step ("open directory",
// "fsync directory").
absl::Status SyncDirectory(const std::string& dir);

// A listening IPv4 TCP socket on `host`:`port` (port 0: any free one),
// close-on-exec, SO_REUSEADDR, plus `socket_flags` (e.g. SOCK_NONBLOCK);
// the port it got goes to *bound_port. InvalidArgument when `host` is not
// an IPv4 address; PosixError naming host:port when a step fails.
absl::StatusOr<int> ListenTcp4(const std::string& host, uint16_t port,
                               int socket_flags, uint16_t* bound_port);

}  // namespace tandem
