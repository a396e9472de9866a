#include "kernels/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define TANDEM_CRC32C_X86 1
#else
#define TANDEM_CRC32C_X86 0
#endif

namespace tandem::kernels {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

// kTables[k][b] is the CRC of byte b followed by k zero bytes, which lets the
// portable loop fold eight input bytes per iteration (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int i = 0; i < 8; ++i)
      crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k)
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // x86 and the targets we build for are LE
  return v;
}

#if TANDEM_CRC32C_X86
// The crc32 instruction has a latency of about 3 cycles and a throughput of
// one per cycle, so one dependent chain uses a third of the unit. Large
// inputs are therefore cut into blocks of three lanes of kLaneBytes each,
// whose CRCs run as three independent chains and are then combined:
// without the pre/post inversion the CRC register is linear over GF(2), so
//   raw(s, A || B) = Zeros(raw(s, A), |B|) ^ raw(0, B)
// where Zeros(x, n) is the register after n zero bytes starting from x.
// Zeros(., kLaneBytes) is itself linear in x: a XOR of per-bit images,
// tabulated per byte of x below (4 lookups per shift).
constexpr size_t kLaneBytes = 8192;

struct ShiftTables {
  uint32_t t[4][256];
};

__attribute__((target("sse4.2"))) uint32_t RawZeros(uint32_t x, size_t n) {
  uint64_t c = x;
  for (size_t i = 0; i < n; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

ShiftTables MakeShiftTables() {
  uint32_t bit_image[32];
  for (int i = 0; i < 32; ++i) bit_image[i] = RawZeros(1u << i, kLaneBytes);
  ShiftTables s{};
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int j = 0; j < 8; ++j) {
        if ((b >> j) & 1u) v ^= bit_image[8 * k + j];
      }
      s.t[k][b] = v;
    }
  }
  return s;
}

const ShiftTables& Shift() {
  static const ShiftTables tables = MakeShiftTables();
  return tables;
}

// The register after kLaneBytes zero bytes starting from x.
inline uint32_t ShiftLane(const ShiftTables& s, uint32_t x) {
  return s.t[0][x & 0xFFu] ^ s.t[1][(x >> 8) & 0xFFu] ^
         s.t[2][(x >> 16) & 0xFFu] ^ s.t[3][x >> 24];
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc,
                                                       const uint8_t* p,
                                                       size_t n) {
  uint64_t c = ~crc;
  // Align to 8 bytes so the 64-bit loads below never straddle lines badly.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  if (n >= 3 * kLaneBytes) {
    const ShiftTables& s = Shift();
    while (n >= 3 * kLaneBytes) {
      uint64_t c1 = 0, c2 = 0;
      const uint8_t* p1 = p + kLaneBytes;
      const uint8_t* p2 = p + 2 * kLaneBytes;
      for (size_t i = 0; i < kLaneBytes; i += 8) {
        c = _mm_crc32_u64(c, LoadLe64(p + i));
        c1 = _mm_crc32_u64(c1, LoadLe64(p1 + i));
        c2 = _mm_crc32_u64(c2, LoadLe64(p2 + i));
      }
      const uint32_t ab =
          ShiftLane(s, static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1);
      c = ShiftLane(s, ab) ^ static_cast<uint32_t>(c2);
      p += 3 * kLaneBytes;
      n -= 3 * kLaneBytes;
    }
  }
  while (n >= 32) {
    c = _mm_crc32_u64(c, LoadLe64(p));
    c = _mm_crc32_u64(c, LoadLe64(p + 8));
    c = _mm_crc32_u64(c, LoadLe64(p + 16));
    c = _mm_crc32_u64(c, LoadLe64(p + 24));
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    c = _mm_crc32_u64(c, LoadLe64(p));
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return ~c32;
}

bool DetectSse42() { return __builtin_cpu_supports("sse4.2"); }
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    --size;
  }
  while (size >= 8) {
    const uint64_t v = LoadLe64(p) ^ c;
    c = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^
        kTables[5][(v >> 16) & 0xFF] ^ kTables[4][(v >> 24) & 0xFF] ^
        kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
        kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    --size;
  }
  return ~c;
}

bool Crc32cHardwareAccelerated() {
#if TANDEM_CRC32C_X86
  static const bool has_sse42 = DetectSse42();
  return has_sse42;
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  if (size == 0) return crc;
#if TANDEM_CRC32C_X86
  if (Crc32cHardwareAccelerated()) {
    return ExtendSse42(crc, static_cast<const uint8_t*>(data), size);
  }
#endif
  return Crc32cExtendPortable(crc, data, size);
}

uint32_t Crc32c(const void* data, size_t size) {
  return Crc32cExtend(0, data, size);
}

namespace {

// Polynomials over GF(2) modulo the CRC polynomial, in the CRC's reflected
// bit order: bit 31 is x^0, bit 0 is x^31.
constexpr uint32_t kOne = 1u << 31;

constexpr uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  // For each term x^i of a (from x^0 up), add b * x^i; b steps one power
  // of x per term, reduced modulo the polynomial as it overflows x^31.
  for (uint32_t term = kOne; term != 0; term >>= 1) {
    if (a & term) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// kPowers[k] = x^(2^k) mod P, for every k Crc32cCombine can need: 3 (one
// byte is 2^3 bits) up to 3 + 63.
using Powers = std::array<uint32_t, 67>;

constexpr Powers MakePowers() {
  Powers p{};
  p[0] = kOne >> 1;  // x^1
  for (size_t k = 1; k < p.size(); ++k) p[k] = MultiplyModP(p[k - 1], p[k - 1]);
  return p;
}

constexpr Powers kPowers = MakePowers();

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  // Appending size_b bytes multiplies a's register by x^(8 size_b); the
  // pre- and post-inversions of the two CRCs cancel in the sum.
  uint32_t shift = kOne;
  uint64_t bits = size_b;
  for (size_t k = 3; bits != 0; bits >>= 1, ++k) {
    if (bits & 1u) shift = MultiplyModP(kPowers[k], shift);
  }
  return MultiplyModP(shift, crc_a) ^ crc_b;
}

uint32_t Crc32cOfChunks(const uint32_t* chunk_crcs, size_t num_chunks,
                        uint64_t chunk_bytes, uint64_t total_bytes) {
  // x^(8 chunk_bytes), the shift of every whole chunk, computed once.
  uint32_t shift = kOne;
  uint64_t bits = chunk_bytes;
  for (size_t k = 3; bits != 0; bits >>= 1, ++k) {
    if (bits & 1u) shift = MultiplyModP(kPowers[k], shift);
  }
  // Multiplying by a fixed `shift` is linear in the other factor: four
  // 256-entry tables (one per byte of it) turn each chunk's 32-step
  // multiplication into four lookups (a 1 GiB buffer in 4 KiB chunks:
  // 262144 of them). Worth building from a few hundred chunks on.
  std::vector<uint32_t> table;
  if (num_chunks >= 256) {
    table.resize(4 * 256);
    for (uint32_t k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        table[k * 256 + v] = MultiplyModP(shift, v << (8 * k));
      }
    }
  }
  auto times_shift = [&](uint32_t crc) {
    if (table.empty()) return MultiplyModP(shift, crc);
    return table[crc & 0xFF] ^ table[256 + ((crc >> 8) & 0xFF)] ^
           table[512 + ((crc >> 16) & 0xFF)] ^ table[768 + (crc >> 24)];
  };
  uint32_t crc = 0;
  for (size_t i = 0; i < num_chunks; ++i) {
    const uint64_t begin = i * chunk_bytes;
    const uint64_t n = std::min(chunk_bytes, total_bytes - begin);
    crc = n == chunk_bytes ? times_shift(crc) ^ chunk_crcs[i]
                           : Crc32cCombine(crc, chunk_crcs[i], n);
  }
  return crc;
}

uint32_t Crc32cExtendParallel(uint32_t crc, const void* data, size_t size,
                              int threads) {
  constexpr size_t kMinPart = size_t{4} << 20;
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t parts = std::min<size_t>(
      static_cast<size_t>(std::max(threads, 1)), size / kMinPart);
  if (parts <= 1) return Crc32cExtend(crc, data, size);
  const size_t step = size / parts;
  std::vector<uint32_t> part_crc(parts, 0);
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  for (size_t i = 1; i < parts; ++i) {
    const size_t begin = i * step;
    const size_t n = i + 1 == parts ? size - begin : step;
    workers.emplace_back(
        [&part_crc, i, p, begin, n] { part_crc[i] = Crc32c(p + begin, n); });
  }
  crc = Crc32cExtend(crc, p, step);
  for (std::thread& w : workers) w.join();
  for (size_t i = 1; i < parts; ++i) {
    const size_t n = i + 1 == parts ? size - i * step : step;
    crc = Crc32cCombine(crc, part_crc[i], n);
  }
  return crc;
}

}  // namespace tandem::kernels
