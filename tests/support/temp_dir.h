// A test's temporary directory: made fresh under $TMPDIR (or /tmp), removed
// with its contents on destruction.
#ifndef TANDEM_TESTS_SUPPORT_TEMP_DIR_H_
#define TANDEM_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace tandem::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tandem_test") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/" +
                          prefix + ".XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SUPPORT_TEMP_DIR_H_
