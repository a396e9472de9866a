#pragma once

// Helpers shared by the weights unit tests: a small model layout and
// random bf16 contents.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_buffer.h"
#include "common/weights/weight_store.h"
#include "kernels/crc32c.h"

namespace tandem::weights::testing {

// Plays an attacker who can write into an unauthenticated stream: flips
// bits among the 64 starting at byte `at` of `data` so that the CRC-32C of
// the whole of `data` stays what it was (CRC is linear: 33 single-bit
// flips always hold a subset whose CRC changes cancel; Gaussian
// elimination over GF(2) finds it). Returns the number of bits flipped
// (> 0), or 0 when `data` is too short.
inline int FlipKeepingCrc32c(absl::Span<uint8_t> data, size_t at) {
  if (at + 8 > data.size()) return 0;
  const uint32_t base = kernels::Crc32c(data.data(), data.size());
  uint32_t basis[32] = {};
  uint64_t masks[32] = {};
  for (int k = 0; k < 64; ++k) {
    const uint8_t bit = static_cast<uint8_t>(1u << (k % 8));
    data[at + k / 8] ^= bit;
    uint32_t v = kernels::Crc32c(data.data(), data.size()) ^ base;
    data[at + k / 8] ^= bit;
    uint64_t m = uint64_t{1} << k;
    for (int b = 31; b >= 0 && v != 0; --b) {
      if ((v >> b & 1u) == 0) continue;
      if (basis[b] == 0) {
        basis[b] = v;
        masks[b] = m;
        v = 0;
        m = 0;
        break;
      }
      v ^= basis[b];
      m ^= masks[b];
    }
    if (m == 0) continue;  // inserted into the basis
    int flipped = 0;
    for (int j = 0; j < 64; ++j) {
      if ((m >> j & 1u) == 0) continue;
      data[at + j / 8] ^= static_cast<uint8_t>(1u << (j % 8));
      ++flipped;
    }
    return flipped;
  }
  return 0;
}

// Stores a copy of `weights` in `store` as FULL version `version` of
// `layout`.
inline absl::Status PutFullVersion(WeightStore& store,
                                   const FlatWeightLayout& layout,
                                   const WeightBuffer& weights,
                                   uint64_t version) {
  auto manifest = layout.BuildManifest(weights.span(), version);
  if (!manifest.ok()) return manifest.status();
  return store.Put(*manifest, std::make_shared<const std::vector<uint8_t>>(
                                  weights.data(), weights.data() + weights.size()));
}

inline std::vector<TensorInfo> SmallModelTensors() {
  return {
      {"model.embed_tokens.weight", v1::DTYPE_BF16, {64, 32}, 64 * 32 * 2},
      {"model.layers.0.input_layernorm.weight", v1::DTYPE_F32, {32}, 32 * 4},
      {"model.layers.0.self_attn.q_proj.weight",
       v1::DTYPE_BF16,
       {32, 32},
       32 * 32 * 2},
      {"model.layers.0.mlp.up_proj.weight",
       v1::DTYPE_BF16,
       {96, 32},
       96 * 32 * 2},
      {"model.norm.weight", v1::DTYPE_BF16, {3}, 3 * 2},
      {"lm_head.weight", v1::DTYPE_BF16, {64, 32}, 64 * 32 * 2},
  };
}

// SmallModelTensors() in 4 KiB buckets aligned to 64 bytes (several
// buckets). Throws, failing the test, if the layout cannot be built.
inline FlatWeightLayout SmallLayout() {
  return FlatWeightLayout::Create(SmallModelTensors(),
                                  {.bucket_bytes = 4096, .alignment = 64})
      .value();
}

// A broadcast group member's config: the store on 127.0.0.1:`port`, the
// epoch's key `prefix`.
inline BroadcastGroupConfig GroupConfig(
    uint16_t port, int rank, int world, std::string prefix,
    absl::Duration timeout = absl::Seconds(20), std::string backend = "gloo") {
  BroadcastGroupConfig c;
  c.backend = std::move(backend);
  c.store_port = port;
  c.key_prefix = std::move(prefix);
  c.rank = rank;
  c.world_size = world;
  c.timeout = timeout;
  return c;
}

// Fills every tensor (not the padding) with random bytes that are finite
// weights (StagingWeights refuses Inf and NaN): the high byte of every
// 16-bit word has bit 6 clear, so no BF16 word and no F32 element (whose
// high word is a BF16 word) has an all-ones exponent, nor gets one from
// Perturb's +1.
inline void FillRandom(const FlatWeightLayout& layout, WeightBuffer* buf,
                       std::mt19937_64& rng) {
  for (const TensorPlacement& t : layout.tensors()) {
    for (uint64_t i = 0; i < t.info.byte_size; ++i) {
      const auto byte = static_cast<uint8_t>(rng());
      buf->data()[t.offset + i] = i % 2 == 1 ? byte & 0xBF : byte;
    }
  }
}

// Changes ~`density` of the bf16 words of the tensors by one ULP.
inline void Perturb(const FlatWeightLayout& layout, WeightBuffer* buf,
                    std::mt19937_64& rng, double density) {
  std::bernoulli_distribution flip(density);
  for (const TensorPlacement& t : layout.tensors()) {
    auto* w = reinterpret_cast<uint16_t*>(buf->data() + t.offset);
    for (uint64_t i = 0; i < t.info.byte_size / 2; ++i) {
      if (flip(rng)) w[i] = static_cast<uint16_t>(w[i] + 1);
    }
  }
}

}  // namespace tandem::weights::testing
