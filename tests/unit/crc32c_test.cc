#include "kernels/crc32c.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace tandem::kernels {
namespace {

TEST_CASE("Crc32c matches the RFC 3720 and check-string vectors", "[crc32c]") {
  const std::string check = "123456789";
  CHECK(Crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(Crc32c(nullptr, 0) == 0u);

  std::vector<uint8_t> buf(32, 0x00);
  CHECK(Crc32c(buf.data(), buf.size()) == 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xFF);
  CHECK(Crc32c(buf.data(), buf.size()) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  CHECK(Crc32c(buf.data(), buf.size()) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  CHECK(Crc32c(buf.data(), buf.size()) == 0x113FDB5Cu);
}

TEST_CASE(
    "Crc32c hardware and portable paths agree at every length and "
    "alignment",
    "[crc32c]") {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data(4096 + 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  INFO("hardware accelerated: " << Crc32cHardwareAccelerated());
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t len : {0, 1, 7, 8, 9, 31, 32, 33, 63, 100, 1000, 4096}) {
      const uint8_t* p = data.data() + offset;
      REQUIRE(Crc32c(p, len) == Crc32cExtendPortable(0, p, len));
    }
  }
}

TEST_CASE("Crc32cExtend over a split equals the CRC of the whole", "[crc32c]") {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> data(10000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {0, 1, 13, 4096, 9999, 10000}) {
    const uint32_t first = Crc32c(data.data(), split);
    CHECK(Crc32cExtend(first, data.data() + split, data.size() - split) ==
          whole);
  }
}

TEST_CASE(
    "Crc32c three-lane blocks agree with the portable path on large inputs",
    "[crc32c]") {
  // The hardware path cuts inputs of 3 x 8 KiB and more into three-lane
  // blocks combined by table shifts; cover block edges, tails and every
  // 8-byte misalignment.
  std::mt19937_64 rng(13);
  std::vector<uint8_t> data(200000 + 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  constexpr size_t kBlock = 3 * 8192;
  for (size_t offset : {0, 1, 3, 8}) {
    for (size_t len :
         {kBlock - 1, kBlock, kBlock + 1, kBlock + 8, 2 * kBlock - 7,
          2 * kBlock, 5 * kBlock + 4093, size_t{200000}}) {
      const uint8_t* p = data.data() + offset;
      INFO("offset " << offset << " length " << len);
      REQUIRE(Crc32c(p, len) == Crc32cExtendPortable(0, p, len));
      const uint32_t head = Crc32c(p, 12345);
      REQUIRE(Crc32cExtend(head, p + 12345, len - 12345) ==
              Crc32cExtendPortable(0, p, len));
    }
  }
  std::vector<uint8_t> zeros(4 * kBlock, 0);
  CHECK(Crc32c(zeros.data(), zeros.size()) ==
        Crc32cExtendPortable(0, zeros.data(), zeros.size()));
}

}  // namespace
}  // namespace tandem::kernels
