// Cost of going live from a staged tensor (common/weights/device_go_live.h)
// on the CPU, per GiB, side by side with a memcpy of the same bytes:
//
//   device_go_live_bench [MiB] [rounds]     (defaults: 1024 MiB, 5 rounds)
//
// One uint8 tensor of finite bf16 weights in 64 MiB buckets; each round
// times
//   copy        memcpy of the buffer (what a host round trip costs per hop)
//   sha256      WeightSha256 of the span (the host path's digest)
//   tensor_sha  TensorSha256 of the CPU tensor in 16 MiB pieces (what the
//               device path runs; on a GPU it adds the pinned D2H pieces,
//               overlapped with the hashing)
//   verify      VerifyStagedTensor without a digest: bucket CRC-32C and
//               the isfinite check
// and prints medians, ms per GiB and each against copy. The SHA-256 is
// the floor of a device go-live's latency: the CRC and finite checks run
// on the device there, the digest on the host.

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/weights/device_digest.h"
#include "common/weights/device_go_live.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_digest.h"
#include "tests/bench/bench_util.h"

namespace tandem::weights {
namespace {

using bench::Median;
constexpr auto Seconds = bench::SecondsSince;

[[noreturn]] void Die(const std::string& why) {
  bench::Die("device_go_live_bench", why);
}

int Main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const uint64_t bytes = mib << 20;
  if (bytes == 0 || rounds <= 0) {
    Die("usage: device_go_live_bench [MiB] [rounds]");
  }
  auto layout = FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}, bytes}},
      {.bucket_bytes = std::min<uint64_t>(bytes, uint64_t{64} << 20),
       .alignment = 64});
  if (!layout.ok()) Die(layout.status().ToString());
  at::Tensor staged =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte));
  auto* words = static_cast<uint64_t*>(staged.data_ptr());
  std::mt19937_64 rng(1);
  // Clearing each bf16's top exponent bit keeps every value finite.
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    words[i] = rng() & 0x3f7f3f7f3f7f3f7fULL;
  }
  const absl::Span<const uint8_t> span(
      static_cast<const uint8_t*>(staged.data_ptr()), bytes);
  auto manifest = layout->BuildManifest(span, 1);
  if (!manifest.ok()) Die(manifest.status().ToString());
  std::vector<uint8_t> copy_dst(bytes);
  std::vector<double> copy, sha, tensor_sha, verify;
  for (int r = 0; r < rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    std::memcpy(copy_dst.data(), span.data(), bytes);
    copy.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> d = WeightSha256(span);
    sha.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> td = TensorSha256(staged);
    tensor_sha.push_back(Seconds(t));
    if (!d.ok() || !td.ok() || *d != *td || *d != manifest->sha256()) {
      Die("TensorSha256 differs from WeightSha256");
    }
    t = std::chrono::steady_clock::now();
    absl::Status s = VerifyStagedTensor(*manifest, *layout, staged, {});
    verify.push_back(Seconds(t));
    if (!s.ok()) Die(s.ToString());
  }
  const double gib = static_cast<double>(bytes) / (1u << 30);
  const double base = Median(copy);
  auto row = [&](const char* name, double s) {
    std::printf("%-10s %9.2f ms  %8.2f ms/GiB  %5.2fx copy\n", name, s * 1e3,
                s * 1e3 / gib, s / base);
  };
  std::printf("staged tensor %llu MiB (CPU), %d rounds, medians\n",
              static_cast<unsigned long long>(mib), rounds);
  row("copy", base);
  row("sha256", Median(sha));
  row("tensor_sha", Median(tensor_sha));
  row("verify", Median(verify));
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) { return tandem::weights::Main(argc, argv); }
