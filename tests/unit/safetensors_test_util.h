#pragma once

// Helpers shared by the safetensors unit tests.

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace tandem::safetensors::testing {

using TempDir = ::tandem::testing::TempDir;

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A raw safetensors file: the little-endian length of `header` (or
// `declared_header_length` when given), `header`, then `data_size` bytes.
inline std::string RawFile(const std::string& header, size_t data_size,
                           int64_t declared_header_length = -1) {
  uint64_t length = declared_header_length >= 0
                        ? static_cast<uint64_t>(declared_header_length)
                        : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(length & 0xff);
    length >>= 8;
  }
  out += header;
  for (size_t i = 0; i < data_size; ++i) out.push_back(static_cast<char>(i));
  return out;
}

inline std::vector<uint8_t> PatternBytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + 7 * i);
  return bytes;
}

}  // namespace tandem::safetensors::testing
