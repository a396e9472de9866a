// Delta codec benchmark: payload size per changed element and as a fraction
// of the full bf16 buffer, against the 6-byte (int32 index + bf16 value)
// baseline and plain LEB128 gap varints, plus encode/apply/crc throughput.
//
//   delta_bench [num_words=33554432] [repeats=3]
//
// Changes are either one-ULP moves (what AdamW at RL learning rates does to
// bf16 weights) or arbitrary new words (worst case for value coding).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "kernels/crc32c.h"

namespace tandem::kernels {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best-of-`repeats` wall time of fn().
template <typename F>
double Time(int repeats, F&& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    fn();
    best = std::min(best, Seconds(start, Clock::now()));
  }
  return best;
}

uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

uint64_t Leb128Bytes(uint64_t v) {
  uint64_t n = 1;
  while (v >= 128) {
    v >>= 7;
    ++n;
  }
  return n;
}

void Run(size_t num_words, int repeats) {
  std::mt19937_64 rng(2024);
  std::normal_distribution<float> init(0.0f, 0.02f);
  std::vector<uint16_t> base(num_words);
  for (auto& w : base) w = ToBf16(init(rng));
  const double full_bytes = 2.0 * static_cast<double>(num_words);

  absl::PrintF("delta_bench: %d bf16 words (%.1f MiB), best of %d\n\n",
               num_words, full_bytes / (1 << 20), repeats);
  absl::PrintF(
      "| changes | density | changed | B/elem int32+bf16 | B/elem LEB128+bf16 "
      "| B/elem Rice+bf16 | B/elem Rice+relative (default) | payload %% of "
      "full (default) | encode GB/s | apply GB/s | apply unchecked GB/s |\n");
  absl::PrintF("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const char* kind : {"1-ULP", "random"}) {
    for (double density : {0.001, 0.01, 0.1}) {
      std::vector<uint16_t> next = base;
      std::bernoulli_distribution flip(density);
      for (auto& w : next) {
        if (!flip(rng)) continue;
        if (kind[0] == '1') {
          w = static_cast<uint16_t>(w + ((rng() & 1) ? 1 : -1));
        } else {
          uint16_t v;
          do v = static_cast<uint16_t>(rng());
          while (v == w);
          w = v;
        }
      }
      std::vector<uint64_t> changed;
      FindChangedWords(base, next, &changed);
      const double n = static_cast<double>(changed.size());
      uint64_t leb = 0, prev = 0;
      for (size_t i = 0; i < changed.size(); ++i) {
        leb += Leb128Bytes(i == 0 ? changed[0] : changed[i] - prev - 1) + 2;
        prev = changed[i];
      }
      std::vector<uint8_t> raw_delta, delta;
      const double encode_s =
          Time(repeats, [&] { delta = *EncodeBf16Delta(base, next); });
      raw_delta = *EncodeBf16Delta(base, next, {DeltaValueCoding::kRaw, 16384});
      std::vector<uint16_t> work;
      double apply_s = 1e30, unchecked_s = 1e30;
      for (int r = 0; r < repeats; ++r) {
        work = base;
        auto t0 = Clock::now();
        if (!ApplyBf16Delta(delta, absl::MakeSpan(work)).ok()) std::abort();
        apply_s = std::min(apply_s, Seconds(t0, Clock::now()));
        if (work != next) std::abort();
        work = base;
        t0 = Clock::now();
        if (!ApplyBf16Delta(delta, absl::MakeSpan(work), false).ok()) {
          std::abort();
        }
        unchecked_s = std::min(unchecked_s, Seconds(t0, Clock::now()));
        if (work != next) std::abort();
      }
      absl::PrintF(
          "| %s | %.1f%% | %d | 6.00 | %.2f | %.2f | %.2f | %.3f%% | %.2f | "
          "%.2f | %.2f |\n",
          kind, density * 100, changed.size(), leb / n, raw_delta.size() / n,
          delta.size() / n, 100.0 * delta.size() / full_bytes,
          full_bytes / encode_s / 1e9, full_bytes / apply_s / 1e9,
          full_bytes / unchecked_s / 1e9);
    }
  }
  absl::PrintF(
      "\nencode = change detection over both buffers + coding, GB/s of one "
      "bf16 buffer; apply = validate + patch in place.\n\n");

  std::vector<uint16_t> next = base;
  for (size_t i = 0; i < next.size(); i += 100) ++next[i];
  const double scan_s =
      Time(repeats, [&] { (void)CountChangedWords(base, next); });
  const double hw_s =
      Time(repeats, [&] { (void)Crc32c(base.data(), full_bytes); });
  const double sw_s = Time(
      repeats, [&] { (void)Crc32cExtendPortable(0, base.data(), full_bytes); });
  absl::PrintF("change scan only (1%%): %.2f GB/s\n",
               full_bytes / scan_s / 1e9);
  absl::PrintF("crc32c %s: %.2f GB/s; portable slicing-by-8: %.2f GB/s\n",
               Crc32cHardwareAccelerated() ? "SSE4.2" : "(no SSE4.2)",
               full_bytes / hw_s / 1e9, full_bytes / sw_s / 1e9);
}

}  // namespace
}  // namespace tandem::kernels

int main(int argc, char** argv) {
  const size_t words =
      argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{1} << 25;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  tandem::kernels::Run(words, repeats);
  return 0;
}
