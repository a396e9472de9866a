#pragma once

// SHA-256 (FIPS 180-4) written for the device kernels of
// sha256_tree_cuda.cu and compiled for the host too (__host__ __device__
// under nvcc, plain inline functions elsewhere), so the same code is tested
// on the CPU against an independent SHA-256 (Python's hashlib,
// tests/unit/sha256_tree_core_test.cc). Only what the tree digest needs:
// one message of `n` bytes followed by one domain byte, hashed in one
// call with no streaming state.
//
// Thread-safe (pure functions).

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_SHA256_HD __host__ __device__ __forceinline__
#define TANDEM_SHA256_CONST __device__ __constant__
#else
#define TANDEM_SHA256_HD inline
#define TANDEM_SHA256_CONST
#endif

namespace tandem::kernels::sha256 {

inline constexpr int kDigestBytes = 32;
inline constexpr int kBlockBytes = 64;

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of
// the cube roots of the first 64 primes. The device reads its copy from
// constant memory, the host this one.
#define TANDEM_SHA256_ROUND_CONSTANTS                                    \
  {                                                                      \
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu,     \
        0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, \
        0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, \
        0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, \
        0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, \
        0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, \
        0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, \
        0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, \
        0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, \
        0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u, 0x1e376c08u, \
        0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, \
        0x682e6ff3u, 0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, \
        0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u               \
  }

#if defined(__CUDACC__)
static TANDEM_SHA256_CONST uint32_t kDeviceRoundConstants[64] =
    TANDEM_SHA256_ROUND_CONSTANTS;
#endif
inline constexpr uint32_t kHostRoundConstants[64] =
    TANDEM_SHA256_ROUND_CONSTANTS;

TANDEM_SHA256_HD uint32_t RoundConstant(int t) {
#if defined(__CUDA_ARCH__)
  return kDeviceRoundConstants[t];
#else
  return kHostRoundConstants[t];
#endif
}

TANDEM_SHA256_HD uint32_t Rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

// Section 5.3.3: the initial hash value.
TANDEM_SHA256_HD void Init(uint32_t h[8]) {
  h[0] = 0x6a09e667u;
  h[1] = 0xbb67ae85u;
  h[2] = 0x3c6ef372u;
  h[3] = 0xa54ff53au;
  h[4] = 0x510e527fu;
  h[5] = 0x9b05688cu;
  h[6] = 0x1f83d9abu;
  h[7] = 0x5be0cd19u;
}

// Section 6.2.2: one 512-bit block `w[0..15]` (big-endian words of the
// message block) into the state `h`. `w` is used as the message schedule's
// 16-word window and is overwritten.
TANDEM_SHA256_HD void Compress(uint32_t h[8], uint32_t w[16]) {
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  uint32_t e = h[4], f = h[5], g = h[6], k = h[7];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int t = 0; t < 64; ++t) {
    uint32_t wt;
    if (t < 16) {
      wt = w[t];
    } else {
      // W_t = sigma1(W_{t-2}) + W_{t-7} + sigma0(W_{t-15}) + W_{t-16},
      // in a ring of 16 words.
      const uint32_t w2 = w[(t - 2) & 15];
      const uint32_t w15 = w[(t - 15) & 15];
      const uint32_t s1 = Rotr(w2, 17) ^ Rotr(w2, 19) ^ (w2 >> 10);
      const uint32_t s0 = Rotr(w15, 7) ^ Rotr(w15, 18) ^ (w15 >> 3);
      wt = s1 + w[(t - 7) & 15] + s0 + w[t & 15];
      w[t & 15] = wt;
    }
    const uint32_t sum1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = k + sum1 + ch + RoundConstant(t) + wt;
    const uint32_t sum0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = sum0 + maj;
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

TANDEM_SHA256_HD uint32_t LoadBigEndian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

TANDEM_SHA256_HD uint32_t ByteSwap(uint32_t x) {
  return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}

// The 16 big-endian words of the 64-byte block at `p`. REQUIRES: `p` is
// 16-byte aligned. On the device: four 16-byte loads (the pattern of the
// CRC-32C kernel), a quarter of the load instructions of 4-byte loads; on
// the host: memcpy (no aliasing of the caller's bytes). The byte order and
// word indices are the same code on both.
struct alignas(16) Words4 {
  uint32_t v[4];
};

TANDEM_SHA256_HD void LoadAlignedBlock(const uint8_t* p, uint32_t w[16]) {
  for (int q = 0; q < 4; ++q) {
    Words4 words;
#if defined(__CUDA_ARCH__)
    words = reinterpret_cast<const Words4*>(p)[q];
#else
    std::memcpy(&words, p + 16 * q, sizeof(words));
#endif
    for (int i = 0; i < 4; ++i) w[4 * q + i] = ByteSwap(words.v[i]);
  }
}

// SHA-256 of the `n` bytes at `data` followed by the one byte `suffix`
// (n + 1 bytes in all), into `out` (32 bytes, the digest's byte order).
// Whole blocks are read as 16-byte words when `data` is 16-byte aligned
// (LoadAlignedBlock), bytewise otherwise.
TANDEM_SHA256_HD void HashWithSuffix(const uint8_t* data, uint64_t n,
                                     uint8_t suffix, uint8_t out[32]) {
  uint32_t h[8];
  Init(h);
  uint32_t w[16];
  uint64_t done = 0;
  const bool aligned = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  for (; done + kBlockBytes <= n; done += kBlockBytes) {
    if (aligned) {
      LoadAlignedBlock(data + done, w);
    } else {
      for (int i = 0; i < 16; ++i) w[i] = LoadBigEndian(data + done + 4 * i);
    }
    Compress(h, w);
  }
  // The tail: the remaining bytes, the suffix, 0x80, zeros and the bit
  // length (section 5.1.1), in one block or two.
  uint8_t tail[2 * kBlockBytes];
  const uint64_t rest = n - done;
  for (uint64_t i = 0; i < rest; ++i) tail[i] = data[done + i];
  tail[rest] = suffix;
  tail[rest + 1] = 0x80;
  const uint64_t tail_bytes =
      rest + 2 + 8 <= kBlockBytes ? kBlockBytes : 2 * kBlockBytes;
  for (uint64_t i = rest + 2; i < tail_bytes - 8; ++i) tail[i] = 0;
  const uint64_t bits = (n + 1) * 8;
  for (int i = 0; i < 8; ++i) {
    tail[tail_bytes - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  }
  for (uint64_t off = 0; off < tail_bytes; off += kBlockBytes) {
    for (int i = 0; i < 16; ++i) w[i] = LoadBigEndian(tail + off + 4 * i);
    Compress(h, w);
  }
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = static_cast<uint8_t>(h[i] >> 24);
    out[4 * i + 1] = static_cast<uint8_t>(h[i] >> 16);
    out[4 * i + 2] = static_cast<uint8_t>(h[i] >> 8);
    out[4 * i + 3] = static_cast<uint8_t>(h[i]);
  }
}

// ---- The tree digest (common/weights/tree_digest.h defines it) ----

inline constexpr uint64_t kTreeLeafBytes = 4096;
inline constexpr uint64_t kTreeFanout = 128;
// The domain byte that ends every hashed message: a leaf, an inner node
// and the root can never hash the same bytes.
inline constexpr uint8_t kTreeLeafDomain = 0x00;
inline constexpr uint8_t kTreeNodeDomain = 0x01;
inline constexpr uint8_t kTreeRootDomain = 0x02;

// Leaves of `n` bytes: ceil(n / L), and one empty leaf for n == 0.
TANDEM_SHA256_HD uint64_t TreeLeafCount(uint64_t n) {
  return n == 0 ? 1 : (n + kTreeLeafBytes - 1) / kTreeLeafBytes;
}

// Nodes of the level above `children` digests: ceil(children / F).
TANDEM_SHA256_HD uint64_t TreeParentCount(uint64_t children) {
  return (children + kTreeFanout - 1) / kTreeFanout;
}

// The digest of leaf `leaf` of the `n` bytes at `data`.
TANDEM_SHA256_HD void TreeLeaf(const uint8_t* data, uint64_t n, uint64_t leaf,
                               uint8_t out[32]) {
  const uint64_t begin = leaf * kTreeLeafBytes;
  const uint64_t rest = n > begin ? n - begin : 0;
  HashWithSuffix(data + begin, rest < kTreeLeafBytes ? rest : kTreeLeafBytes,
                 kTreeLeafDomain, out);
}

// The digest of node `node` of the level above the `children` digests
// (32 bytes each, in order) at `level`.
TANDEM_SHA256_HD void TreeNode(const uint8_t* level, uint64_t children,
                               uint64_t node, uint8_t out[32]) {
  const uint64_t first = node * kTreeFanout;
  const uint64_t rest = children - first;
  const uint64_t count = rest < kTreeFanout ? rest : kTreeFanout;
  HashWithSuffix(level + first * kDigestBytes, count * kDigestBytes,
                 kTreeNodeDomain, out);
}

// The root over the top digest: it binds the length and both constants.
TANDEM_SHA256_HD void TreeRoot(const uint8_t top[32], uint64_t n,
                               uint8_t out[32]) {
  uint8_t message[kDigestBytes + 16];
  for (int i = 0; i < kDigestBytes; ++i) message[i] = top[i];
  for (int i = 0; i < 8; ++i) {
    message[kDigestBytes + i] = static_cast<uint8_t>(n >> (8 * i));
  }
  for (int i = 0; i < 4; ++i) {
    message[kDigestBytes + 8 + i] =
        static_cast<uint8_t>(kTreeLeafBytes >> (8 * i));
    message[kDigestBytes + 12 + i] =
        static_cast<uint8_t>(kTreeFanout >> (8 * i));
  }
  HashWithSuffix(message, sizeof(message), kTreeRootDomain, out);
}

}  // namespace tandem::kernels::sha256

#undef TANDEM_SHA256_ROUND_CONSTANTS
