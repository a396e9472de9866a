#pragma once

// Runs tests/unit/tree_digest_reference.py (Python's hashlib, an SHA-256
// this project did not write) on buffers written to temporary files, for
// the tests of the tree digest's host and device implementations.
// REQUIRES: TANDEM_TEST_PYTHON and TANDEM_TREE_DIGEST_REFERENCE defined by
// the test's CMake target (the build's python and the checkout's script);
// the environment variables of the same names override them (a GPU bundle
// runs elsewhere: tests/gpu/run.sh sets both).

#include <stdio.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::testing {

// The script, or "" when it is not there (a bundle run without run.sh).
inline std::string TreeDigestReferenceScript() {
  const char* env = std::getenv("TANDEM_TREE_DIGEST_REFERENCE");
  std::string script = env != nullptr ? env : TANDEM_TREE_DIGEST_REFERENCE;
  return std::filesystem::exists(script) ? script : "";
}

// The reference digests (32 raw bytes each) of `buffers`, `mode` "tree" or
// "sha256"; empty when the script could not run (the caller FAILs).
inline std::vector<std::string> ReferenceDigests(
    const std::string& mode, const std::vector<std::vector<uint8_t>>& buffers) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("tandem-tree-digest-", ::getpid());
  std::filesystem::create_directories(dir);
  const char* python = std::getenv("TANDEM_TEST_PYTHON");
  std::string command =
      absl::StrCat(python != nullptr ? python : TANDEM_TEST_PYTHON, " ",
                   TreeDigestReferenceScript(), " ", mode);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::filesystem::path file = dir / absl::StrCat(i, ".bin");
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(buffers[i].data()),
              static_cast<std::streamsize>(buffers[i].size()));
    absl::StrAppend(&command, " ", file.string());
  }
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r"); pipe != nullptr) {
    char chunk[4096];
    size_t got = 0;
    while ((got = std::fread(chunk, 1, sizeof(chunk), pipe)) > 0) {
      output.append(chunk, got);
    }
    if (::pclose(pipe) != 0) output.clear();
  }
  std::filesystem::remove_all(dir);
  std::vector<std::string> digests;
  for (absl::string_view line :
       absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    digests.push_back(absl::HexStringToBytes(line));
  }
  if (digests.size() != buffers.size()) digests.clear();
  return digests;
}

}  // namespace tandem::testing
