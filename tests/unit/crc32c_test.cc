#include "kernels/crc32c.h"

#include <algorithm>
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

TEST_CASE("Crc32cCombine of two halves equals the CRC of the whole",
          "[crc32c]") {
  std::mt19937_64 rng(17);
  std::vector<uint8_t> data(300000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t len :
       {size_t{0}, size_t{1}, size_t{9}, size_t{4096}, size_t{300000}}) {
    const uint32_t whole = Crc32c(data.data(), len);
    for (size_t split : {size_t{0}, len / 3, len / 2, len}) {
      INFO("length " << len << " split " << split);
      CHECK(Crc32cCombine(Crc32c(data.data(), split),
                          Crc32c(data.data() + split, len - split),
                          len - split) == whole);
    }
  }
  // "123456789" split as "1234" + "56789": the check value 0xE3069283.
  const char* digits = "123456789";
  CHECK(Crc32cCombine(Crc32c(digits, 4), Crc32c(digits + 4, 5), 5) ==
        0xE3069283u);
  // A flipped byte in the second half changes the combined CRC.
  std::vector<uint8_t> other(data.begin(), data.begin() + 1000);
  other[900] ^= 1;
  CHECK(Crc32cCombine(Crc32c(data.data(), 500), Crc32c(other.data() + 500, 500),
                      500) != Crc32c(data.data(), 1000));
  // Lengths past 4 GiB only change the power of x: combining with a block
  // of 2^32 + 5 zero bytes equals extending by them piecewise.
  const uint32_t a = Crc32c(data.data(), 100);
  const uint64_t big = (uint64_t{1} << 32) + 5;
  uint32_t zeros_crc = 0;
  std::vector<uint8_t> zeros(1 << 24, 0);
  for (uint64_t done = 0; done < big;) {
    const uint64_t n = std::min<uint64_t>(zeros.size(), big - done);
    zeros_crc = Crc32cExtend(zeros_crc, zeros.data(), n);
    done += n;
  }
  uint32_t extended = a;
  for (uint64_t done = 0; done < big;) {
    const uint64_t n = std::min<uint64_t>(zeros.size(), big - done);
    extended = Crc32cExtend(extended, zeros.data(), n);
    done += n;
  }
  CHECK(Crc32cCombine(a, zeros_crc, big) == extended);
}

TEST_CASE("Crc32cExtendParallel equals Crc32cExtend", "[crc32c]") {
  std::mt19937_64 rng(19);
  std::vector<uint8_t> data((size_t{13} << 20) + 7);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t prefix = Crc32c("prefix", 6);
  for (size_t len : {size_t{1000}, size_t{8} << 20, data.size()}) {
    for (int threads : {1, 2, 3, 8}) {
      INFO("length " << len << " threads " << threads);
      CHECK(Crc32cExtendParallel(prefix, data.data(), len, threads) ==
            Crc32cExtend(prefix, data.data(), len));
    }
  }
  const uint32_t before = Crc32c(data.data(), data.size());
  data[data.size() - 3] ^= 0x40;  // in the last part
  const uint32_t after = Crc32cExtendParallel(0, data.data(), data.size(), 3);
  CHECK(after == Crc32c(data.data(), data.size()));
  CHECK(after != before);
}

TEST_CASE("Crc32cOfChunks joins per-chunk CRCs into the CRC of the whole",
          "[crc32c]") {
  // The host half of the device checksum (kernels/cuda/crc32c_cuda.h):
  // chunks checksummed independently, joined in order.
  std::mt19937_64 rng(11);
  std::vector<uint8_t> data(100'003);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (uint64_t chunk : {uint64_t{1}, uint64_t{4}, uint64_t{4096},
                         uint64_t{16384}, uint64_t{100'003},
                         uint64_t{1} << 20}) {
    for (uint64_t total : {uint64_t{0}, uint64_t{1}, uint64_t{4096},
                           uint64_t{99'999}, uint64_t{100'003}}) {
      if (chunk == 1 && total > 4096) continue;  // one combine per byte
      const size_t chunks = (total + chunk - 1) / chunk;
      std::vector<uint32_t> crcs(chunks);
      for (size_t i = 0; i < chunks; ++i) {
        const uint64_t begin = i * chunk;
        crcs[i] = Crc32c(data.data() + begin, std::min(chunk, total - begin));
      }
      INFO("chunk " << chunk << ", total " << total);
      CHECK(Crc32cOfChunks(crcs.data(), crcs.size(), chunk, total) ==
            Crc32c(data.data(), total));
    }
  }
  // A chunk's CRC out of place changes the result.
  std::vector<uint32_t> crcs(2);
  crcs[0] = Crc32c(data.data(), 4096);
  crcs[1] = Crc32c(data.data() + 4096, 4096);
  std::swap(crcs[0], crcs[1]);
  CHECK(Crc32cOfChunks(crcs.data(), 2, 4096, 8192) !=
        Crc32c(data.data(), 8192));
}

}  // namespace
}  // namespace tandem::kernels
