#include "common/base/executable_dir.h"

#include <filesystem>
#include <system_error>

namespace tandem {

std::string ExecutableDir() {
  std::error_code ec;
  const std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

}  // namespace tandem
