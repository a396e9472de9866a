// common/base/posix.h: POSIX and filesystem errors become statuses whose
// message names the attempt and the system's reason and whose code follows
// the error; SyncDirectory syncs a directory or says which step failed.

#include "common/base/posix.h"

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

#include <catch2/catch.hpp>

namespace tandem {
namespace {

TEST_CASE("PosixError codes follow errno and the message names the attempt",
          "[base][posix]") {
  const absl::Status missing = PosixError(ENOENT, "/x/y: open");
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(missing.message() == "/x/y: open: No such file or directory");
  CHECK(PosixError(EACCES, "a").code() == absl::StatusCode::kPermissionDenied);
  CHECK(PosixError(EROFS, "a").code() == absl::StatusCode::kPermissionDenied);
  CHECK(PosixError(ENOSPC, "a").code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(PosixError(EIO, "a").code() == absl::StatusCode::kInternal);
  const absl::Status fs = FilesystemError(
      std::make_error_code(std::errc::no_such_file_or_directory), "/p",
      "rename");
  CHECK(fs.code() == absl::StatusCode::kNotFound);
  CHECK(fs.message() == "/p: rename: No such file or directory");
}

TEST_CASE("SyncDirectory syncs a directory and names the one it cannot open",
          "[base][posix]") {
  const std::string dir = std::filesystem::temp_directory_path().string();
  CHECK(SyncDirectory(dir).ok());
  const absl::Status missing = SyncDirectory(dir + "/tandem-no-such-dir-xyz");
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(missing.message() ==
        dir + "/tandem-no-such-dir-xyz: open directory: No such file or "
              "directory");
}

}  // namespace
}  // namespace tandem
