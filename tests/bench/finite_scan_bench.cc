// Cost of the finite check on received weights (issue 19), side by side
// with what a receiver already does to every byte.
//
//   finite_scan_bench [MiB] [rounds]     (defaults: 256 MiB, 7 rounds)
//
// On one buffer of random finite bf16 weights in 64 MiB buckets (the
// trainer's default bucket is 256 MiB; smaller ones give more, shorter
// scans), each round times, alternating the order:
//   copy     memcpy of the buffer (what a receive writes)
//   crc      CRC-32C of the buffer (what a receive verifies)
//   scan     kernels::FindNonFinite over it as BF16 (the finite check)
//   stage    StagePayload into a double-buffered StagingWeights: copy,
//            CRC and finite check of every bucket, as a transport does
//   commit   StagingWeights::Commit (the engine's pause: a pointer swap;
//            the scan never runs here)
// and prints the median of each, GB/s, and scan / stage: the share of a
// receive the finite check costs.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/staging_weights.h"
#include "common/weights/weight_transport.h"
#include "kernels/crc32c.h"
#include "kernels/finite_scan.h"
#include "tests/bench/bench_util.h"

namespace tandem::weights {
namespace {

using bench::Median;
constexpr auto Seconds = bench::SecondsSince;

[[noreturn]] void Die(const std::string& why) {
  bench::Die("finite_scan_bench", why);
}

int Main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  const uint64_t bytes = mib << 20;
  auto layout = FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}, bytes}},
      {.bucket_bytes = uint64_t{64} << 20, .alignment = 64});
  if (!layout.ok()) Die(layout.status().ToString());
  std::vector<uint8_t> payload(bytes);
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = rng() & 0xBFBFBFBFBFBFBFBFull;  // finite bf16 words
    std::memcpy(payload.data() + i, &r, 8);
  }
  std::vector<uint8_t> copy(bytes, 1);
  auto staging = StagingWeights::Create(*layout, StagingMode::kDoubleBuffer);
  if (!staging.ok()) Die(staging.status().ToString());
  std::vector<double> copy_s, crc_s, scan_s, stage_s, commit_s;
  volatile uint32_t sink = 0;
  for (int r = -1; r < rounds; ++r) {  // round -1 warms up, untimed
    auto manifest = layout->BuildManifest(payload, static_cast<uint64_t>(r + 2));
    if (!manifest.ok()) Die(manifest.status().ToString());
    double c = 0, k = 0, s = 0, st = 0, cm = 0;
    auto timed = [](auto&& f) {
      const auto t = std::chrono::steady_clock::now();
      f();
      return Seconds(t);
    };
    auto run_copy = [&] {
      c = timed([&] { std::memcpy(copy.data(), payload.data(), bytes); });
    };
    auto run_crc = [&] {
      k = timed([&] { sink = kernels::Crc32c(payload.data(), bytes); });
    };
    auto run_scan = [&] {
      s = timed([&] {
        if (kernels::FindNonFinite(payload, kernels::FloatFormat::kBF16)) {
          Die("random finite weights hold a non-finite value");
        }
      });
    };
    auto run_stage = [&] {
      st = timed([&] {
        if (absl::Status e = StagePayload(staging->get(), *manifest, payload);
            !e.ok()) {
          Die(e.ToString());
        }
      });
      cm = timed([&] {
        if (!(*staging)->Commit().ok()) Die("commit failed");
      });
    };
    if (r % 2 == 0) {
      run_copy(), run_crc(), run_scan(), run_stage();
    } else {
      run_stage(), run_scan(), run_crc(), run_copy();
    }
    if (r < 0) continue;
    copy_s.push_back(c), crc_s.push_back(k), scan_s.push_back(s);
    stage_s.push_back(st), commit_s.push_back(cm);
  }
  auto row = [&](const char* name, const std::vector<double>& v) {
    const double m = Median(v);
    absl::PrintF("| %-6s | %9.2f ms | %6.2f GB/s |\n", name, m * 1e3,
                 bytes / m / 1e9);
  };
  absl::PrintF("%d MiB of bf16 weights, 64 MiB buckets, median of %d "
               "rounds\n\n| step   | time         | throughput  |\n"
               "| --- | --- | --- |\n",
               mib, rounds);
  row("copy", copy_s);
  row("crc", crc_s);
  row("scan", scan_s);
  row("stage", stage_s);
  absl::PrintF("| commit | %9.4f ms | (pointer swap) |\n",
               Median(commit_s) * 1e3);
  absl::PrintF("\nscan / stage = %.2f: the finite check's share of staging "
               "a received version\n",
               Median(scan_s) / Median(stage_s));
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) { return tandem::weights::Main(argc, argv); }
